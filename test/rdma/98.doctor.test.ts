// `node-ibverbs doctor` with a real device (the built CLI, as a user runs it):
// - healthy Soft-RoCE (rxe on a dummy netdev): every check ok, or a warn that
//   says why and what to do; the rdma_cm loopback connects on every address;
// - a low memlock limit (prlimit 64 KiB, CAP_IPC_LOCK dropped: root has it and
//   it lifts the limit) with --register 1M: the memlock check fails, with the fix;
// - the netdev down (restored after): the port check fails, with the fix.
// The report is printed, so a run shows the doctor's real output.
import { expect } from 'vitest'
import { execFileSync, spawn } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { openDevice } from '../../dist/index.js'
import type { DoctorCheck, DoctorReport } from '../../dist/index.js'
import { envMissing, needs } from './needs.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const cli = join(root, 'dist', 'cli', 'main.js')
const device = process.env.SOFTROCE_DEVICE!
const netdev = process.env.SOFTROCE_NETDEV!
const addr = process.env.SOFTROCE_ADDR!
const addr6 = process.env.SOFTROCE_ADDR6
const LIMIT = 65536 // what `ulimit -l 64` gives

interface Ran { status: number | null; stdout: string; stderr: string }

/** Runs the CLI (under `prefix`, e.g. prlimit) without blocking the test's event loop. */
function run(prefix: string[], ...args: string[]): Promise<Ran> {
  const argv = [...prefix, process.execPath, cli, 'doctor', ...args]
  return new Promise((resolve) => {
    const env = { ...process.env }
    delete env.NODE_IBVERBS_ADDON
    const child = spawn(argv[0]!, argv.slice(1), { env, stdio: ['ignore', 'pipe', 'pipe'], timeout: 240_000 })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (c) => { stdout += c })
    child.stderr.on('data', (c) => { stderr += c })
    child.on('close', (status) => resolve({ status, stdout, stderr }))
  })
}

function parse(out: Ran): DoctorReport {
  try {
    return JSON.parse(out.stdout) as DoctorReport
  } catch {
    throw new Error(`doctor printed no JSON (exit ${out.status}):\n${out.stdout}\n${out.stderr}`)
  }
}

const find = (report: DoctorReport, id: DoctorCheck['id']) => report.checks.filter((c) => c.id === id)

/** Polls until check() is true; throws after timeoutMs. */
async function until(what: string, check: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

const missing = envMissing('SOFTROCE_DEVICE', 'SOFTROCE_NETDEV', 'SOFTROCE_ADDR')

needs(missing)('healthy Soft-RoCE: every check ok or an explained warn, rdma_cm loopback ok on each address, exit 0', async () => {
  const text = await run([])
  console.log(text.stdout)
  expect(text.status, text.stdout + text.stderr).toBe(0)

  const report = parse(await run([], '--json', '--register', '1M'))
  expect(report).toMatchObject({ version: 1, ok: true })
  expect(report.counts.fail).toBe(0)
  for (const check of report.checks) {
    expect(['ok', 'warn', 'skip'], `${check.id} ${check.subject ?? ''}: ${check.message}`).toContain(check.status)
    if (check.status === 'warn') expect(check.fix, `${check.id} warns without a fix`).toBeTruthy()
  }
  // Only the rxe check may be skipped here (a device exists): nothing else was left out.
  expect(report.checks.filter((c) => c.status === 'skip').map((c) => c.id)).toEqual(['rxe'])

  const [devices] = find(report, 'devices')
  expect(devices).toMatchObject({ status: 'ok', facts: { names: expect.arrayContaining([device]) } })
  const port = find(report, 'port').find((c) => c.subject === `${device} port 1`)
  expect(port).toMatchObject({ status: 'ok', facts: { state: 'ACTIVE', linkLayer: 'Ethernet', netdev } })
  const mtu = find(report, 'mtu').find((c) => c.subject === `${device} port 1`)
  const netdevMtu = Number(execFileSync('cat', [`/sys/class/net/${netdev}/mtu`], { encoding: 'utf8' }))
  expect(mtu).toMatchObject({ status: 'ok', facts: { netdev, netdevMtu } })
  // The GID index the doctor names is the one the library uses, and it is the netdev's IPv4 address.
  const gid = find(report, 'gid').find((c) => c.subject === `${device} port 1`)
  const opened = openDevice(device)
  let expectedIndex: number
  try { expectedIndex = opened.defaultGidIndex(1) } finally { opened.close() }
  expect(gid).toMatchObject({ status: 'ok', facts: { index: expectedIndex, gid: `::ffff:${addr}`, type: 'RoCEv2', netdev } })
  // A dummy netdev: no fabric, so PFC/ECN do not apply (and the doctor does not guess).
  const [lossless] = find(report, 'lossless')
  expect(lossless).toMatchObject({ status: 'ok', facts: { kind: 'dummy', pfc: 'not-applicable' } })
  // --register 1M was really registered on the device (root: CAP_IPC_LOCK).
  const [memlock] = find(report, 'memlock')
  expect(memlock).toMatchObject({ status: 'ok', facts: { requestedBytes: 1 << 20, triedOn: device, errorCode: null } })
  // rdma_cm connected to itself on each address of the port, on this device, and passed a message each way.
  const cm = find(report, 'rdma-cm')
  const addresses = cm.map((c) => c.id === 'rdma-cm' ? c.facts.address : '')
  expect(addresses).toContain(addr)
  if (addr6) expect(addresses).toContain(addr6)
  for (const check of cm) {
    expect(check, check.message).toMatchObject({ status: 'ok', facts: { device, connectedDevice: device, errorCode: null } })
    if (check.id === 'rdma-cm') expect(check.facts.pathMtu).toBe(mtu?.id === 'mtu' ? mtu.facts.activeMtu : -1)
  }
}, 300_000)

needs(missing)('RLIMIT_MEMLOCK of 64 KiB without CAP_IPC_LOCK and --register 1M: memlock fails with the fix, exit 1', async () => {
  const prefix = ['setpriv', '--inh-caps=-ipc_lock', '--bounding-set=-ipc_lock', 'prlimit', `--memlock=${LIMIT}:${LIMIT}`]
  const out = await run(prefix, '--json', '--register', '1M')
  const report = parse(out)
  const [memlock] = find(report, 'memlock')
  console.log(JSON.stringify(memlock, null, 2))
  expect(out.status).toBe(1)
  expect(report.ok).toBe(false)
  expect(memlock).toMatchObject({
    status: 'fail',
    facts: { limitBytes: LIMIT, capIpcLock: false, requestedBytes: 1 << 20, triedOn: device, errorCode: 'ERR_MEMLOCK_LIMIT' },
  })
  expect(memlock!.message).toContain('RLIMIT_MEMLOCK 64 KiB')
  expect(memlock!.fix).toContain('ulimit -l unlimited')
  expect(memlock!.fix).toContain('LimitMEMLOCK=infinity')
  // Without --register, the same limit is a warning that says how small it is.
  const [plain] = find(parse(await run(prefix, '--json')), 'memlock')
  expect(plain).toMatchObject({ status: 'warn', facts: { limitBytes: LIMIT, requestedBytes: null, triedOn: null } })
  expect(plain!.fix).toContain('ulimit -l unlimited')
}, 300_000)

// Takes the netdev down and up: only in the throwaway guest.
const inGuest = missing ?? (process.env.SOFTROCE_MODE === 'vm' ? undefined : 'takes the netdev down and up: only in the throwaway QEMU guest (SOFTROCE_MODE=vm)')

needs(inGuest)('the netdev down: the port check fails with `ip link set <netdev> up`, exit 1', async () => {
  const portState = () => {
    const d = openDevice(device)
    try { return d.queryPort(1).state } finally { d.close() }
  }
  const hasGid = (gid: string) => {
    const d = openDevice(device)
    try { return d.gids(1).some((g) => g.gid === gid) } finally { d.close() }
  }
  execFileSync('ip', ['link', 'set', netdev, 'down'])
  try {
    await until(`${device} port 1 to leave ACTIVE`, () => portState() !== 'ACTIVE')
    const out = await run([], '--json')
    const report = parse(out)
    const port = find(report, 'port').find((c) => c.subject === `${device} port 1`)
    console.log(JSON.stringify(port, null, 2))
    expect(out.status).toBe(1)
    expect(port).toMatchObject({ status: 'fail', facts: { netdev, netdevState: 'down' } })
    expect(port!.message).toMatch(/^not ACTIVE: (DOWN|INIT|ARMED)/)
    expect(port!.fix).toContain(`ip link set ${netdev} up`)
    // Nothing is tried on a port that is down: rdma_cm is skipped, naming the port check.
    const cm = find(report, 'rdma-cm').find((c) => c.subject === `${device} port 1`)
    expect(cm).toMatchObject({ status: 'skip' })
    expect(cm!.message).toContain('port check')
  } finally {
    // Later suites need the port ACTIVE and both addresses' GIDs back (an IPv6
    // address may be flushed while the link is down).
    execFileSync('ip', ['link', 'set', netdev, 'up'])
    await until(`${device} port 1 to be ACTIVE again`, () => portState() === 'ACTIVE')
    if (addr6 && !execFileSync('ip', ['-6', 'addr', 'show', 'dev', netdev], { encoding: 'utf8' }).includes(addr6)) {
      execFileSync('ip', ['-6', 'addr', 'add', `${addr6}/64`, 'dev', netdev, 'nodad'])
    }
    await until(`the GID of ${addr} to return`, () => hasGid(`::ffff:${addr}`))
    if (addr6) await until(`the GID of ${addr6} to return`, () => hasGid(addr6))
  }
}, 300_000)
