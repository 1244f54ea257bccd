#!/usr/bin/env node
// node-ibverbs command-line tool: devices, doctor, bench, softroce.
import { spawn } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { ProgressLine } from './progress.js'

const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const softroceScript = join(packageRoot, 'scripts', 'softroce.sh')
// The same advice as openDevice()'s: native rxe first, a QEMU guest second.

const USAGE = `usage: node-ibverbs COMMAND

  devices [--json]                 RDMA devices, ports, state, MTU, link layer, GIDs
  doctor [--json] [--register SIZE] [--timeout MS]
                                   checks this machine end to end and says what to fix
                                   (exit code 1 when a check fails)
  bench TEST [--size N] [--iters N] [--poll event|busy] [--batch] [--tx-depth N]
             [--warm-s N | --cold] [--device NAME] [--json]
                                   one of our benchmarks (perftest-like), our side only;
                                   runs untimed for --warm-s seconds first (default 5:
                                   V8 optimizes over the first seconds), --cold: no warm-up
                                   TEST: write_bw read_bw send_bw atomic_fadd_bw atomic_cas_bw
                                         write_lat read_lat send_lat
  bench transfer [--op write|read] [--blocks N] [--block-size N] [--qps N] [--repeat N]
             [--latency [--warm-s N | --cold]] [--iters N] [--host ADDR] [--device NAME] [--transport rdma|tcp]
             [--net] [--json]
                                   the transfer engine: two agents on the device move
                                   N random non-contiguous blocks (default 4096 x 16 KiB)
                                   in one transfer, every block checked; --latency: a
                                   1-block write with a notification, one at a time,
                                   after --warm-s seconds (default 5) untimed;
                                   --transport tcp: two agents on loopback, no device;
                                   --net: a plain node:net socket moving the same bytes;
                                   on a terminal a progress line (bytes, rate, ETA) on stderr
  softroce up|status|down          manage a native Soft-RoCE device (scripts/softroce.sh)
  softroce run [OPTIONS] -- CMD    run CMD with a Soft-RoCE device (QEMU guest if needed)
`

class CliError extends Error {
  constructor(message: string, readonly exitCode = 1) { super(message) }
}

/** "Max locked memory" soft limit in bytes from /proc/self/limits (undefined: unlimited/unknown). */
export function memlockLimit(): number | undefined {
  try {
    const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find((l) => l.startsWith('Max locked memory'))
    const soft = line?.slice('Max locked memory'.length).trim().split(/\s+/)[0]
    if (!soft || soft === 'unlimited') return undefined
    return Number(soft)
  } catch {
    return undefined
  }
}

function memlockHint(): string {
  const limit = memlockLimit()
  const now = limit === undefined ? 'unlimited or unknown' : `${(limit / 1024).toFixed(0)} KiB`
  return `Memory registration failed: the locked-memory limit (ulimit -l, "Max locked memory" in /proc/self/limits) is ${now}. ` +
    'Raise it: `ulimit -l unlimited` in the shell (as root), LimitMEMLOCK=infinity for a systemd service, ' +
    '--ulimit memlock=-1 for docker, or a "* - memlock unlimited" line in /etc/security/limits.conf.'
}

/** Turns setup problems into helpful messages. */
function explain(error: unknown): never {
  const e = error as Error & { code?: string; syscall?: string; errno?: number; devices?: unknown }
  if (e instanceof CliError) throw e
  if (e?.code === 'ERR_ADDON_LOAD') throw new CliError(e.message)
  if (e?.code === 'ENODEV') {
    const msg = String(e.message)
    // openDevice() lists the devices that exist: none, and its message says how to get one
    if (Array.isArray(e.devices) && e.devices.length === 0) throw new CliError(msg.replace(/npx node-ibverbs /g, 'node-ibverbs '))
    throw new CliError(`${msg}\nA port must be ACTIVE: check the netdev under it is up (ip link set <netdev> up) and \`node-ibverbs devices\`.`)
  }
  if ((e?.code === 'ENOMEM' || e?.code === 'EPERM' || e?.code === 'EAGAIN') && /reg_mr|MemoryRegion|alloc/i.test(`${e.syscall ?? ''} ${e.message}`)) {
    throw new CliError(`${e.message}\n${memlockHint()}`)
  }
  if (e?.code === 'ENOMEM' || e?.code === 'EPERM') {
    const limit = memlockLimit()
    if (limit !== undefined && limit < 64 << 20) throw new CliError(`${e.message}\n${memlockHint()}`)
  }
  throw error
}

interface Flags { positional: string[]; flags: Map<string, string | true>; rest: string[] }

function parse(argv: string[], withValue: Set<string>): Flags {
  const positional: string[] = []
  const flags = new Map<string, string | true>()
  let rest: string[] = []
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!
    if (a === '--') { rest = argv.slice(i + 1); break }
    if (a.startsWith('--')) {
      const [k, v] = a.slice(2).split('=', 2) as [string, string | undefined]
      if (v !== undefined) flags.set(k, v)
      else if (withValue.has(k)) {
        if (i + 1 >= argv.length) throw new CliError(`--${k} needs a value`, 2)
        flags.set(k, argv[++i]!)
      } else flags.set(k, true)
    } else positional.push(a)
  }
  return { positional, flags, rest }
}

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => (r[c] ?? '').length)))
  return rows.map((r) => r.map((cell, c) => cell.padEnd(widths[c]!)).join('  ').trimEnd()).join('\n')
}

async function devices(argv: string[]): Promise<void> {
  const { flags } = parse(argv, new Set())
  const { listDevices, openDevice, Device } = await import('../index.js')
  const list = listDevices()
  const out = list.map((info) => {
    const device = new Device(info.name)
    try {
      const attrs = device.query()
      const ports = []
      for (let p = 1; p <= attrs.physPortCount; p++) {
        const port = device.queryPort(p)
        ports.push({
          port: p, state: port.state, activeMtu: port.activeMtu, maxMtu: port.maxMtu, linkLayer: port.linkLayer, lid: port.lid,
          gids: device.gids(p),
        })
      }
      return {
        name: info.name, guid: info.guid, nodeType: info.nodeType, transport: info.transport,
        firmwareVersion: attrs.firmwareVersion, vendorId: attrs.vendorId, vendorPartId: attrs.vendorPartId,
        maxQp: attrs.maxQp, maxQpWr: attrs.maxQpWr, maxCqe: attrs.maxCqe, maxMrSize: String(attrs.maxMrSize), atomicCap: attrs.atomicCap,
        ports,
      }
    } finally {
      device.close()
    }
  })
  if (flags.has('json')) {
    console.log(JSON.stringify(out, null, 2))
    return
  }
  if (out.length === 0) {
    openDevice().close() // throws ENODEV with how to get a device (explain() turns it into the CLI's message)
    throw new CliError('No RDMA devices on this machine')
  }
  const lines: string[] = []
  for (const d of out) {
    lines.push(`${d.name}  (node GUID ${d.guid}, ${d.nodeType}, fw ${d.firmwareVersion || '-'}, vendor 0x${d.vendorId.toString(16)}:0x${d.vendorPartId.toString(16)}, atomics ${d.atomicCap})`)
    lines.push(table([
      ['port', 'state', 'MTU (active/max)', 'link layer', 'LID'],
      ...d.ports.map((p) => [String(p.port), p.state, `${p.activeMtu}/${p.maxMtu}`, p.linkLayer, String(p.lid)]),
    ]).replace(/^/gm, '  '))
    for (const p of d.ports) {
      if (p.gids.length === 0) { lines.push(`  port ${p.port}: no GIDs`); continue }
      lines.push(table([
        [`  port ${p.port} GID index`, 'GID', 'type', 'netdev'],
        ...p.gids.map((g) => [`  ${g.index}`, g.gid, g.type, g.netdev ?? '-']),
      ]).replace(/^/gm, '  '))
    }
    const warnings: string[] = []
    for (const p of d.ports) {
      if (p.state !== 'ACTIVE') warnings.push(`port ${p.port} is ${p.state}: bring its netdev up (ip link set <netdev> up) or check the cable/switch`)
      if (p.linkLayer === 'Ethernet' && !p.gids.some((g) => g.type === 'RoCEv2')) {
        warnings.push(`port ${p.port} has no RoCE v2 GID: give its netdev an IP address (ip addr add <addr>/<len> dev <netdev>)`)
      }
    }
    for (const w of warnings) lines.push(`  warning: ${w}`)
    lines.push('')
  }
  const limit = memlockLimit()
  if (limit !== undefined && limit < 64 << 20) lines.push(`note: locked-memory limit is ${(limit / 1024).toFixed(0)} KiB (ulimit -l); large registrations may fail with ENOMEM`)
  console.log(lines.join('\n').trimEnd())
}

function progressBar(label: string): { update(f: number): void; done(): void } {
  const tty = process.stderr.isTTY
  let last = -1
  const started = Date.now()
  return {
    update(f) {
      if (Date.now() - started < 1000) return // only for long runs
      const pct = Math.floor(Math.min(1, f) * 100)
      if (pct === last) return
      last = pct
      if (tty) {
        const width = 30, filled = Math.round((pct / 100) * width)
        process.stderr.write(`\r${label} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${pct}%`)
      } else if (pct % 10 === 0) process.stderr.write(`${label}: ${pct}%\n`)
    },
    done() { if (tty && last >= 0) process.stderr.write('\r\x1b[K') },
  }
}

/** The option --k as a positive integer, or `d` when it is not given. */
function positiveInt(flags: Flags['flags'], k: string, d: number): number {
  const v = flags.get(k)
  if (v === undefined) return d
  const n = Number(v)
  if (!Number.isInteger(n) || n <= 0) throw new CliError(`--${k} must be a positive integer`, 2)
  return n
}

async function bench(argv: string[]): Promise<void> {
  if (argv[0] === 'transfer') return benchTransfer(argv.slice(1))
  const { positional, flags } = parse(argv, new Set(['size', 'iters', 'poll', 'tx-depth', 'device', 'batch-size', 'warm-s']))
  const { TESTS, runBench } = await import('./bench.js')
  const test = positional[0]
  if (!test || !(TESTS as readonly string[]).includes(test)) throw new CliError(`bench: TEST must be one of ${TESTS.join(', ')}\n\n${USAGE}`, 2)
  const num = (k: string, d: number): number => positiveInt(flags, k, d)
  const poll = flags.get('poll') ?? 'event'
  if (poll !== 'event' && poll !== 'busy') throw new CliError('--poll must be event or busy', 2)
  const isBw = test.endsWith('_bw')
  const size = num('size', isBw ? 65536 : 2)
  const iters = num('iters', isBw ? 5000 : 1000)
  // Warm by default, as bench/ does: V8 optimizes in the background over the first seconds.
  const warmSeconds = flags.has('cold') ? 0 : num('warm-s', 5)
  const bar = progressBar(`${test} ${size} B`)
  const device = flags.get('device')
  let result
  try {
    result = await runBench({
      test: test as never, size, iters, poll, batch: flags.has('batch'), txDepth: num('tx-depth', 128),
      batchSize: flags.has('batch-size') ? num('batch-size', 32) : undefined,
      device: typeof device === 'string' ? device : undefined,
      warmupMs: warmSeconds * 1000,
      progress: (f) => bar.update(f),
    })
  } catch (error) {
    bar.done()
    explain(error)
  }
  bar.done()
  if (flags.has('json')) {
    console.log(JSON.stringify({ ...result, poll, batch: flags.has('batch'), warmupSeconds: warmSeconds }, null, 2))
  } else if (result.kind === 'bw') {
    console.log(warmNote(warmSeconds))
    console.log(table([
      ['#bytes', '#iterations', 'BW average[MB/sec]', 'MsgRate[Mpps]', 'poll', 'batch'],
      [String(result.size), String(result.iters), result.mbPerSec.toFixed(2), result.mpps.toFixed(6), poll, flags.has('batch') ? 'yes' : 'no'],
    ]))
  } else {
    console.log(warmNote(warmSeconds))
    const f = (v: number) => v.toFixed(2)
    console.log(table([
      ['#bytes', '#iterations', 't_min[usec]', 't_max[usec]', 't_typical[usec]', 't_avg[usec]', '99% percentile[usec]', '99.9% percentile[usec]', 'poll'],
      [String(result.size), String(result.iters), f(result.tMin), f(result.tMax), f(result.tTypical), f(result.tAvg), f(result.p99), f(result.p999), poll],
    ]))
  }
}

function warmNote(seconds: number): string {
  return seconds > 0 ? `# warmed up for ${seconds} s before timing (--cold: a fresh process)` : '# cold: timed from a fresh process, no warm-up'
}

async function benchTransfer(argv: string[]): Promise<void> {
  const { flags } = parse(argv, new Set(['op', 'blocks', 'block-size', 'qps', 'repeat', 'iters', 'size', 'host', 'device', 'transport', 'warm-s']))
  const { TransferBench } = await import('./bench-transfer.js')
  const num = (k: string, d: number): number => positiveInt(flags, k, d)
  const text = (k: string): string | undefined => { const v = flags.get(k); return typeof v === 'string' ? v : undefined }
  const op = text('op') ?? 'write'
  if (op !== 'write' && op !== 'read') throw new CliError('--op must be write or read', 2)
  const blocks = num('blocks', 4096)
  const blockSize = num('block-size', 16384)
  const host = text('host')
  const device = text('device')
  const transport = text('transport') ?? 'rdma'
  if (transport !== 'rdma' && transport !== 'tcp') throw new CliError('--transport must be rdma or tcp', 2)
  let bench
  try {
    bench = await TransferBench.open({ maxBytes: blocks * blockSize, transport, ...(host ? { host } : {}), ...(device ? { device } : {}) })
  } catch (error) {
    explain(error)
  }
  try {
    if (flags.has('latency')) {
      const warmSeconds = flags.has('cold') ? 0 : num('warm-s', 5)
      const r = await bench.notifyLatency(num('size', 4096), num('iters', 1000), { warmupMs: warmSeconds * 1000 })
      if (flags.has('json')) return console.log(JSON.stringify(r, null, 2))
      const f = (v: number) => v.toFixed(2)
      console.log(table([
        ['#bytes', '#iterations', 'notified typ[usec]', 'notified 99%[usec]', 'resolved typ[usec]', 'resolved 99%[usec]'],
        [String(r.size), String(r.iters), f(r.notifiedTypical), f(r.notifiedP99), f(r.resolvedTypical), f(r.resolvedP99)],
      ]))
      console.log(warmNote(warmSeconds))
      return
    }
    const c = { op, blocks, blockSize, qps: num('qps', 2), repeat: num('repeat', 1) } as const
    if (flags.has('net')) {
      const n = await bench.plainNet(c)
      if (flags.has('json')) return console.log(JSON.stringify(n, null, 2))
      return console.log(table([['op', '#blocks', 'block[B]', 'plain node:net BW[MB/sec]'], [op, String(blocks), String(blockSize), n.mbPerSec.toFixed(2)]]))
    }
    // On a terminal, a progress line on stderr while it runs; none when piped.
    const line = new ProgressLine(process.stderr, `${op} ${blocks} x ${blockSize} B`, blocks * blockSize * c.repeat)
    let r
    try {
      r = await bench.run({ ...c, ...(line.drawing ? { onProgress: (done: number) => line.update(done) } : {}) })
    } finally {
      line.end()
    }
    if (flags.has('json')) return console.log(JSON.stringify(r, null, 2))
    console.log(table([
      ['op', '#blocks', 'block[B]', 'qps', 'work requests', 'BW average[MB/sec]', 'plan[ms]'],
      [r.op, String(r.blocks), String(r.blockSize), String(r.qps), String(r.workRequests), r.mbPerSec.toFixed(2), r.planMs.toFixed(2)],
    ]))
  } finally {
    bench.close()
  }
}

async function softroce(argv: string[]): Promise<void> {
  const sub = argv[0]
  if (!sub || !['up', 'status', 'down', 'run', 'provision', 'help'].includes(sub)) throw new CliError(`softroce: expected up, status, down or run\n\n${USAGE}`, 2)
  if (!existsSync(softroceScript)) throw new CliError(`softroce: ${softroceScript} is missing from this installation`)
  const child = spawn('bash', [softroceScript, ...argv], { stdio: 'inherit' })
  const forward = (signal: NodeJS.Signals) => child.kill(signal)
  process.on('SIGINT', forward).on('SIGTERM', forward)
  const code = await new Promise<number>((resolve) => {
    child.on('error', (e) => { console.error(`softroce: ${e.message}`); resolve(127) })
    child.on('close', (c, signal) => resolve(c ?? (signal === 'SIGINT' ? 130 : 128 + 15)))
  })
  process.exitCode = code
}

async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv
  switch (command) {
    case 'devices':
      try { return await devices(rest) } catch (error) { explain(error) }
      return
    case 'doctor':
      process.exitCode = await (await import('./doctor.js')).doctorMain(rest)
      return
    case 'bench': return bench(rest)
    case 'softroce': return softroce(rest)
    case 'help': case '-h': case '--help':
      process.stdout.write(USAGE)
      return
    case undefined:
      throw new CliError(`no command given\n\n${USAGE}`, 2)
    default:
      throw new CliError(`unknown command '${command}'\n\n${USAGE}`, 2)
  }
}

main(process.argv.slice(2)).catch((error: unknown) => {
  if (error instanceof CliError) {
    console.error(`node-ibverbs: ${error.message}`)
    process.exit(error.exitCode)
  }
  console.error(`node-ibverbs: ${(error as Error)?.stack ?? error}`)
  process.exit(1)
})
