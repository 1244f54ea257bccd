// Interoperability with rdma-core's own example programs, in both roles:
// ibv_rc_pingpong (raw verbs + its TCP exchange) against examples/rc-pingpong.mjs,
// and librdmacm's rdma_server / rdma_client against examples/rdma-echo.mjs.
// Every combination runs the C program and our example as child processes
// (4 Node children in all: Node starts slowly in the emulated guest) with
// bounded timeouts, and checks both exit statuses and both outputs.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { afterAll, beforeAll, describe, expect, test } from 'vitest'
import { testDevice } from './helpers.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const RC_PINGPONG = `${ROOT}examples/rc-pingpong.mjs`
const RDMA_ECHO = `${ROOT}examples/rdma-echo.mjs`
const CHILD_TIMEOUT = 60_000
const ITERS = 200
const SIZE = 4096

interface Result { code: number | null; signal: string | null; stdout: string; stderr: string; timedOut: boolean; ms: number }
interface Running { child: ChildProcess; done: Promise<Result>; exited: boolean }

const running = new Set<Running>()

/** Spawns a program; it is killed (SIGKILL) if it runs longer than timeoutMs. */
function start(command: string, args: string[], timeoutMs = CHILD_TIMEOUT): Running {
  const t0 = performance.now()
  // Line-buffer the C programs' stdout (a pipe would hold it until exit, or lose it on a kill).
  const child = spawn(command === process.execPath ? command : 'stdbuf', command === process.execPath ? args : ['-oL', '-eL', command, ...args],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env } })
  let stdout = ''
  let stderr = ''
  child.stdout!.setEncoding('utf8').on('data', (s: string) => { stdout += s })
  child.stderr!.setEncoding('utf8').on('data', (s: string) => { stderr += s })
  let timedOut = false
  const timer = setTimeout(() => { timedOut = true; child.kill('SIGKILL') }, timeoutMs)
  const entry: Running = { child, exited: false, done: undefined as never }
  entry.done = new Promise<Result>((resolve) => {
    child.on('error', (error) => { stderr += `spawn error: ${error.message}\n` })
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      entry.exited = true
      running.delete(entry)
      resolve({ code, signal, stdout, stderr, timedOut, ms: Math.round(performance.now() - t0) })
    })
  })
  running.add(entry)
  return entry
}

const node = (script: string, args: string[]) => start(process.execPath, [script, ...args])

/** Waits until check() holds; fails early if the server exited. */
async function until(what: string, server: Running, check: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (check()) return
    if (server.exited) {
      const r = await server.done
      throw new Error(`the server exited (${r.code ?? r.signal}) before ${what}:\n${r.stdout}\n${r.stderr}`)
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

/** A TCP socket in LISTEN state on this port (IPv4 or IPv6). */
function tcpListening(port: number): boolean {
  const hex = port.toString(16).toUpperCase().padStart(4, '0')
  return ['/proc/net/tcp', '/proc/net/tcp6'].some((file) => {
    try {
      return readFileSync(file, 'utf8').split('\n').some((line) => {
        const f = line.trim().split(/\s+/)
        return f[1]?.endsWith(`:${hex}`) && f[3] === '0A'
      })
    } catch {
      return false
    }
  })
}

/** An rdma_cm id in LISTEN state on this port (from `rdma resource show cm_id`). */
function cmListening(port: number): boolean {
  const r = spawnSync('rdma', ['-j', 'resource', 'show', 'cm_id'], { encoding: 'utf8', timeout: 5000 })
  if (r.status !== 0) return false
  try {
    return (JSON.parse(r.stdout) as Array<Record<string, string>>).some((id) => id.state === 'LISTEN' && String(id['src-addr']).endsWith(`:${port}`))
  } catch {
    return false
  }
}

function show(label: string, r: Result): string {
  return `${label}: exit ${r.code}${r.signal ? ` signal ${r.signal}` : ''}${r.timedOut ? ' (killed on timeout)' : ''} after ${r.ms} ms\n--- stdout\n${r.stdout}--- stderr\n${r.stderr}`
}

function expectOk(label: string, r: Result): void {
  expect(r.timedOut, show(label, r)).toBe(false)
  expect(r.code, show(label, r)).toBe(0)
}

interface Address { qpn: number; psn: number; gid: string }
/** The "  local address:  LID 0x0000, QPN 0x000011, PSN 0x..., GID ..." lines both implementations print. */
function addresses(stdout: string): { local: Address; remote: Address } {
  const one = (which: string): Address => {
    const m = new RegExp(`^\\s*${which} address:\\s+LID 0x[0-9a-f]{4}, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6}), GID (\\S+)$`, 'm').exec(stdout)
    if (!m) throw new Error(`no "${which} address" line in:\n${stdout}`)
    return { qpn: parseInt(m[1]!, 16), psn: parseInt(m[2]!, 16), gid: m[3]! }
  }
  return { local: one('local'), remote: one('remote') }
}

/** ibv_rc_pingpong's summary lines (our example prints the same two). */
function expectSummary(label: string, r: Result): void {
  expect(r.stdout, show(label, r)).toMatch(new RegExp(`^${SIZE * ITERS * 2} bytes in \\d+\\.\\d\\d seconds = [\\d.]+ Mbit/sec$`, 'm'))
  expect(r.stdout, show(label, r)).toMatch(new RegExp(`^${ITERS} iters in \\d+\\.\\d\\d seconds = [\\d.]+ usec/iter$`, 'm'))
}

/** Each side's remote address is the other side's local address. */
function expectPaired(c: Result, ours: Result): void {
  const a = addresses(c.stdout)
  const b = addresses(ours.stdout)
  expect(a.remote, 'C side saw our address').toEqual(b.local)
  expect(b.remote, 'we saw the C side\'s address').toEqual(a.local)
  expect(a.local.gid).toBe(`::ffff:${process.env.SOFTROCE_ADDR}`)
}

const timings: string[] = []

let device = ''
let gidIndex = 1
let addr = ''

beforeAll(() => {
  const dev = testDevice()
  device = dev.name
  gidIndex = dev.defaultGidIndex(1)
  dev.close()
  addr = process.env.SOFTROCE_ADDR ?? ''
  if (!addr) throw new Error('SOFTROCE_ADDR (the IPv4 address of the RDMA netdev) must be set: run under scripts/softroce.sh')
  for (const tool of ['ibv_rc_pingpong', 'rdma_server', 'rdma_client', 'stdbuf', 'rdma']) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0) throw new Error(`${tool} is not installed (scripts/softroce.sh provision installs it)`)
  }
})

afterAll(() => {
  for (const r of running) r.child.kill('SIGKILL')
  if (timings.length) console.log(`interop timings:\n  ${timings.join('\n  ')}`)
})

describe('ibv_rc_pingpong (verbs, TCP exchange of LID:QPN:PSN:GID)', () => {
  test('C server, node-ibverbs client', async () => {
    const port = 18611
    const cServer = start('ibv_rc_pingpong', ['-d', device, '-g', String(gidIndex), '-n', String(ITERS), '-s', String(SIZE), '-p', String(port)])
    await until(`ibv_rc_pingpong listening on TCP ${port}`, cServer, () => tcpListening(port))
    const client = node(RC_PINGPONG, ['--device', device, '--gid-index', String(gidIndex), '--iters', String(ITERS), '--size', String(SIZE), '--port', String(port), '127.0.0.1'])
    const [c, ours] = await Promise.all([cServer.done, client.done])
    timings.push(`rc_pingpong C server ${c.ms} ms, node client ${ours.ms} ms`)
    expectOk('ibv_rc_pingpong server', c)
    expectOk('rc-pingpong.mjs client', ours)
    expectSummary('ibv_rc_pingpong server', c)
    expectSummary('rc-pingpong.mjs client', ours)
    expect(ours.stdout).toContain(`rc-pingpong: client OK: ${ITERS} sends and ${ITERS} receives of ${SIZE} bytes`)
    expectPaired(c, ours)
  }, 120_000)

  test('node-ibverbs server, C client', async () => {
    const port = 18612
    const server = node(RC_PINGPONG, ['--server', '--device', device, '--gid-index', String(gidIndex), '--iters', String(ITERS), '--size', String(SIZE), '--port', String(port)])
    await until(`rc-pingpong.mjs listening on TCP ${port}`, server, () => tcpListening(port))
    const cClient = start('ibv_rc_pingpong', ['-d', device, '-g', String(gidIndex), '-n', String(ITERS), '-s', String(SIZE), '-p', String(port), '127.0.0.1'])
    const [ours, c] = await Promise.all([server.done, cClient.done])
    timings.push(`rc_pingpong node server ${ours.ms} ms, C client ${c.ms} ms`)
    expectOk('rc-pingpong.mjs server', ours)
    expectOk('ibv_rc_pingpong client', c)
    expectSummary('ibv_rc_pingpong client', c)
    expectSummary('rc-pingpong.mjs server', ours)
    expect(ours.stdout).toContain(`rc-pingpong: server OK: ${ITERS} sends and ${ITERS} receives of ${SIZE} bytes`)
    expectPaired(c, ours)
  }, 120_000)
})

describe('rdma_server / rdma_client (librdmacm, 16-byte SEND each way)', () => {
  test('C rdma_server, node-ibverbs client', async () => {
    const port = 7481
    const cServer = start('rdma_server', ['-p', String(port)])
    await until(`rdma_server listening on rdma_cm port ${port}`, cServer, () => cmListening(port))
    const client = node(RDMA_ECHO, ['--host', addr, '--port', String(port)])
    const [c, ours] = await Promise.all([cServer.done, client.done])
    timings.push(`rdma_server C ${c.ms} ms, node client ${ours.ms} ms`)
    expectOk('rdma_server', c)
    expectOk('rdma-echo.mjs client', ours)
    expect(c.stdout, show('rdma_server', c)).toMatch(/^rdma_server: start\nrdma_server: end 0\n$/)
    expect(ours.stdout, show('rdma-echo.mjs client', ours)).toMatch(new RegExp(`^rdma-echo: client OK: sent 16 bytes to ${addr.replace(/\./g, '\\.')}:${port}, received 16 bytes back`, 'm'))
  }, 120_000)

  test('node-ibverbs server, C rdma_client', async () => {
    const port = 7482
    const server = node(RDMA_ECHO, ['--server', '--port', String(port)])
    await until(`rdma-echo.mjs listening on rdma_cm port ${port}`, server, () => cmListening(port))
    const cClient = start('rdma_client', ['-s', addr, '-p', String(port)])
    const [ours, c] = await Promise.all([server.done, cClient.done])
    timings.push(`rdma_server node ${ours.ms} ms, C rdma_client ${c.ms} ms`)
    expectOk('rdma-echo.mjs server', ours)
    expectOk('rdma_client', c)
    expect(c.stdout, show('rdma_client', c)).toMatch(/^rdma_client: start\nrdma_client: end 0\n$/)
    expect(ours.stdout, show('rdma-echo.mjs server', ours)).toMatch(new RegExp(`^rdma-echo: server OK: received 16 bytes from ${addr.replace(/\./g, '\\.')}:\\d+, sent 16 bytes back`, 'm'))
  }, 120_000)
})
