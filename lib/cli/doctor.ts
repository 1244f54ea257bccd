// `node-ibverbs doctor [--json] [--register SIZE] [--timeout MS]`: checks this
// machine end to end (rdma-core, the addon, devices and ports, MTU, GIDs,
// memlock, rdma_cm, RoCE's lossless settings, Soft-RoCE) and says what to
// fix. Exit code 1 when a check fails. The report's JSON is public API
// (lib/core/doctor-report.ts).
import { readFileSync } from 'node:fs'
import { release } from 'node:os'
import { isAvailable, listDevices, loadError, openDevice } from '../index.js'
import type { DoctorCheck, DoctorReport, DoctorStatus } from '../index.js'
import {
  addonCheck, devicesCheck, gidCheck, losslessCheck, mtuCheck, portCheck, portViews, rdmaCoreCheck, rxeCheck,
} from './doctor-checks.js'
import { cmAddresses, memlockCheck, rdmaCmCheck } from './doctor-live.js'
import { rxeState } from './doctor-probes.js'

export interface DoctorOptions {
  /** Bytes to register for the memlock check (--register); null: compare the limit only. */
  register: number | null
  /** The bound on each rdma_cm loopback connection, in milliseconds. */
  timeoutMs: number
}

const packageVersion = (): string => {
  try {
    return (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version
  } catch {
    return 'unknown'
  }
}

/** Runs every check. Never throws: a check that throws is reported as failed with its error. */
export async function runDoctor(options: DoctorOptions): Promise<DoctorReport> {
  const checks: DoctorCheck[] = []
  // The addon first: loading it (and listing devices) maps rdma-core's libraries and providers, which rdma-core's check reads.
  const available = isAvailable()
  let names: string[] = []
  let listError: Error | undefined
  if (available) {
    try { names = listDevices().map((d) => d.name) } catch (error) { listError = error as Error }
  }
  checks.push(rdmaCoreCheck(), addonCheck(loadError()))
  const rxe = rxeState()
  if (!available) {
    checks.push(
      { id: 'devices', status: 'skip', message: 'not run: the addon does not load (addon check)', facts: { names: [], kernelDevices: [] } },
      rxeCheck(rxe, 0),
    )
    return report(checks)
  }
  if (listError) {
    checks.push({ id: 'devices', status: 'fail', message: `listDevices() failed: ${listError.message}`, fix: 'check /dev/infiniband exists and is readable (ls -l /dev/infiniband)', facts: { names: [], kernelDevices: [] } })
    return report(checks)
  }
  const { views, broken } = portViews(openDevice, names)
  const devices = devicesCheck(names, rxe)
  if (broken.length && devices.status === 'ok') {
    devices.status = 'fail'
    devices.message += `; cannot open ${broken.map((b) => `${b.name} (${b.error.message})`).join(', ')}`
    devices.fix = 'check the permissions of /dev/infiniband/uverbs* (the rdma group, or udev rules) and that ib_uverbs is loaded'
  }
  checks.push(devices, rxeCheck(rxe, names.length))
  try {
    for (const view of views) {
      const guarded = (fn: () => DoctorCheck | undefined, id: Exclude<DoctorCheck['id'], 'doctor'>) => {
        try {
          const check = fn()
          if (check) checks.push(check)
        } catch (error) {
          checks.push(threw(id, `${view.name} port ${view.port}`, error))
        }
      }
      guarded(() => portCheck(view), 'port')
      guarded(() => mtuCheck(view), 'mtu')
      guarded(() => gidCheck(view), 'gid')
      guarded(() => losslessCheck(view), 'lossless')
    }
    const active = views.find((v) => v.info.state === 'ACTIVE')
    try {
      checks.push(memlockCheck(options.register, active?.name ?? null))
    } catch (error) {
      checks.push(threw('memlock', undefined, error))
    }
    for (const view of views) {
      const subject = `${view.name} port ${view.port}`
      if (view.info.state !== 'ACTIVE') {
        checks.push({ id: 'rdma-cm', subject, status: 'skip', message: `not run: the port is ${view.info.state} (port check)`, facts: cmFacts(view.name) })
        continue
      }
      const addresses = cmAddresses(view)
      if (addresses.length === 0) {
        checks.push({ id: 'rdma-cm', subject, status: view.info.linkLayer === 'Ethernet' ? 'warn' : 'skip', facts: cmFacts(view.name),
          message: view.info.linkLayer === 'Ethernet' ? 'no IP address in the GID table to connect to (gid check)' : 'not run: InfiniBand ports need an IPoIB address for rdma_cm; none is in the GID table',
          ...(view.info.linkLayer === 'Ethernet' ? { fix: `ip addr add <addr>/<len> dev ${view.netdev ?? '<netdev>'}` } : {}) })
        continue
      }
      for (const { address, family } of addresses) checks.push(await rdmaCmCheck(view, address, family, options.timeoutMs))
    }
  } finally {
    for (const device of new Set(views.map((v) => v.device))) device.close()
  }
  return report(checks)
}

function cmFacts(device: string) {
  return { device, address: '', family: 'IPv4' as const, port: null, connectedDevice: null, pathMtu: null, elapsedMs: null, errorCode: null }
}

/** A check that threw: a failure that names the error (a defect of the doctor or a machine it does not expect). */
function threw(check: Exclude<DoctorCheck['id'], 'doctor'>, subject: string | undefined, error: unknown): DoctorCheck {
  const e = error as Error & { code?: string }
  return {
    id: 'doctor', ...(subject ? { subject } : {}), status: 'fail',
    message: `the ${check} check threw: ${e?.code ? `${e.code}: ` : ''}${e?.message ?? String(error)}`,
    fix: 'report this with the output of node-ibverbs doctor --json', facts: { check, errorCode: e?.code ?? null },
  }
}

function report(checks: DoctorCheck[]): DoctorReport {
  const counts: Record<DoctorStatus, number> = { ok: 0, warn: 0, fail: 0, skip: 0 }
  for (const check of checks) counts[check.status]++
  // Each check's keys in one order (id, subject, status, message, fix, facts), whichever way it was built.
  const ordered = checks.map(({ id, subject, status, message, fix, facts }) =>
    ({ id, ...(subject === undefined ? {} : { subject }), status, message, ...(fix === undefined ? {} : { fix }), facts }) as DoctorCheck)
  return { version: 1, ok: counts.fail === 0, package: packageVersion(), node: process.version, kernel: release(), counts, checks: ordered }
}

/** "1M", "64k", "2GiB", "4096" -> bytes (binary units). */
export function parseSize(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?$/i.exec(text.trim())
  if (!match) return undefined
  const bytes = Number(match[1]) * 1024 ** ' kmgt'.indexOf((match[2] || ' ').toLowerCase())
  return Number.isSafeInteger(bytes) && bytes > 0 ? bytes : undefined
}

export function formatReport(r: DoctorReport): string {
  const lines = [`node-ibverbs ${r.package} doctor (Node ${r.node}, Linux ${r.kernel})`]
  const width = Math.max(...r.checks.map((c) => c.id.length + (c.subject ? c.subject.length + 1 : 0)))
  for (const c of r.checks) {
    const what = c.subject ? `${c.id} ${c.subject}` : c.id
    lines.push(`${c.status.padEnd(5)} ${what.padEnd(width)}  ${c.message}`)
    if (c.fix) lines.push(`${' '.repeat(6 + width + 2)}fix: ${c.fix}`)
  }
  lines.push(`${r.counts.ok} ok, ${r.counts.warn} warn, ${r.counts.fail} fail, ${r.counts.skip} skipped${r.ok ? '' : ' (exit code 1)'}`)
  return lines.join('\n')
}

const USAGE = 'usage: node-ibverbs doctor [--json] [--register SIZE] [--timeout MS]'

/** The command: prints the report (text or --json) and returns the exit code (0, 1 on a failed check, 2 on bad arguments). */
export async function doctorMain(argv: string[]): Promise<number> {
  let json = false
  let register: number | null = null
  let timeoutMs = 10_000
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i]!.split('=', 2) as [string, string | undefined]
    const value = () => inline ?? argv[++i]
    if (flag === '--json') json = true
    else if (flag === '--register') {
      const v = value()
      const size = v === undefined ? undefined : parseSize(v)
      if (size === undefined) return usage(`--register needs a size (bytes, or with K/M/G: 1M), got ${v ?? 'nothing'}`)
      register = size
    } else if (flag === '--timeout') {
      const n = Number(value())
      if (!Number.isInteger(n) || n <= 0) return usage('--timeout needs a positive number of milliseconds')
      timeoutMs = n
    } else if (flag === '--help' || flag === '-h') {
      process.stdout.write(`${USAGE}\n`)
      return 0
    } else return usage(`unknown option ${argv[i]}`)
  }
  const result = await runDoctor({ register, timeoutMs })
  process.stdout.write(json ? `${JSON.stringify(result, null, 2)}\n` : `${formatReport(result)}\n`)
  return result.ok ? 0 : 1
}

function usage(problem: string): number {
  process.stderr.write(`node-ibverbs doctor: ${problem}\n${USAGE}\n`)
  return 2
}
