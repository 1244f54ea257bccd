// rdma_cm DEVICE_REMOVAL on a real rxe device: `rdma link delete` while a
// listener waits for a request and a connection has requests in flight.
// rdma_get_cm_event(3): the ids on a removed device must be destroyed. rxe
// has no disassociate_ucontext, so the delete blocks until this process has
// closed every context on the device: the delete finishing is itself the
// proof that nothing of ours is left on it.
// The device removed is this file's own (REMOVED, on a dummy netdev of its
// own), never the suite's: librdmacm (v44) cannot release the context of the
// host's last device (its device-list sync gives up on an empty list), and
// later files keep their device.
import { afterAll, beforeAll, expect } from 'vitest'
import { execFileSync, spawn } from 'node:child_process'
import { readdirSync, readlinkSync } from 'node:fs'
import { connect, listen, openDevice, type Connection, type Listener, type RdmaError } from '../../dist/index.js'
import { within } from './helpers.js'
import { envMissing, needs } from './needs.js'

const REMOVED = 'rxe67'
const NETDEV = 'ibv67'
const HOST = '198.18.67.1'
/** Guards against hangs only (the emulated guest is slow): never a measure of speed. */
const BOUND_MS = 60_000
const missing = envMissing('SOFTROCE_DEVICE')

/** This process's open files on removed devices ("/dev/infiniband/uverbs1 (deleted)"). */
function filesOnRemovedDevices(): string[] {
  const found: string[] = []
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const target = readlinkSync(`/proc/self/fd/${fd}`)
      if (target.startsWith('/dev/infiniband/uverbs') && target.endsWith('(deleted)')) found.push(target)
    } catch { /* closed meanwhile */ }
  }
  return found
}

async function until(what: string, check: () => boolean): Promise<void> {
  const deadline = Date.now() + BOUND_MS
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

function ready(): boolean {
  try {
    const device = openDevice(REMOVED)
    try { return device.queryPort(1).state === 'ACTIVE' && device.gids(1).some((g) => g.gid === `::ffff:${HOST}`) } finally { device.close() }
  } catch {
    return false
  }
}

const sh = (...argv: string[]) => execFileSync(argv[0]!, argv.slice(1), { stdio: 'pipe', timeout: 30_000 })
const hasDevice = () => execFileSync('rdma', ['link', 'show'], { encoding: 'utf8' }).includes(`${REMOVED}/`)

let deleting: Promise<number | null> | undefined
let opened: Array<Connection | Listener> = []

beforeAll(async () => {
  if (missing) return
  sh('ip', 'link', 'add', NETDEV, 'type', 'dummy')
  sh('ip', 'addr', 'add', `${HOST}/24`, 'dev', NETDEV)
  sh('ip', 'link', 'set', NETDEV, 'up')
  sh('rdma', 'link', 'add', REMOVED, 'type', 'rxe', 'netdev', NETDEV)
  await until(`${REMOVED} port 1 ACTIVE with the GID of ${HOST}`, ready)
}, 2 * BOUND_MS)

afterAll(async () => {
  if (missing) return
  for (const o of opened) o.close()
  if (deleting) await within(deleting, BOUND_MS, 'rdma link delete')
  if (hasDevice()) sh('rdma', 'link', 'delete', REMOVED)
  sh('ip', 'link', 'delete', NETDEV)
}, 3 * BOUND_MS)

needs(missing)('removing the device closes the listener (accept rejects ERR_DEVICE_REMOVED) and the connection (its requests fail), and nothing of ours stays on it', async () => {
  const listener = await listen({ host: HOST, port: 0 })
  opened.push(listener)
  const accepting = (async () => (await listener.accept())!.accept({ receiveJson: true }))()
  const client = await connect({ host: HOST, port: listener.address!.port, receiveJson: true, timeoutMs: BOUND_MS })
  const server = await accepting
  opened.push(client, server)
  // Proof the connection works before the removal: a message crosses.
  const first = server.receiveJson()
  await client.sendJson({ hello: 1 })
  expect(await first).toEqual({ hello: 1 })

  const listenerClosed = new Promise<RdmaError | undefined>((resolve) => listener.once('closed', resolve))
  const waitingAccept = listener.accept()
  waitingAccept.catch(() => {}) // awaited below
  // Per connection: the reason of its one 'disconnected', and what a send made in that handler got.
  const seen = new Map<Connection, { reason: string; refused: Promise<unknown> }>()
  const twice: Connection[] = []
  for (const conn of [client, server]) {
    conn.on('disconnected', (reason) => {
      if (seen.has(conn)) twice.push(conn)
      // In the handler the QP is failed, not yet closed: a new request names why as its cause.
      const refused = conn.sendJson({ late: true }).then(() => new Error('resolved'), (e: unknown) => e)
      seen.set(conn, { reason, refused })
    })
  }
  const received = [client.receiveJson(), server.receiveJson()]
  received.forEach((p) => p.catch(() => {}))

  deleting = new Promise((resolve) => spawn('rdma', ['link', 'delete', REMOVED], { stdio: 'inherit' }).once('exit', resolve))

  await expect(within(waitingAccept, BOUND_MS, 'listener.accept()')).rejects.toMatchObject({ code: 'ERR_DEVICE_REMOVED' })
  expect(await within(listenerClosed, BOUND_MS, "the listener's 'closed'")).toMatchObject({ code: 'ERR_DEVICE_REMOVED' })
  expect(listener.error?.code).toBe('ERR_DEVICE_REMOVED')
  expect(listener.address).toBeNull()
  // Future accepts too.
  await expect(listener.accept()).rejects.toMatchObject({ code: 'ERR_DEVICE_REMOVED' })

  for (const p of received) {
    const error = await within(p.then(() => new Error('resolved'), (e: unknown) => e), BOUND_MS, 'a pending receiveJson()')
    expect(typeof (error as RdmaError).code).toBe('string')
  }
  await until("both connections' 'disconnected'", () => seen.size === 2 && client.closed && server.closed)
  expect(twice).toEqual([])
  // The peer may see the DREQ of the other id's destruction before its own DEVICE_REMOVAL.
  expect([...seen.values()].map((v) => v.reason)).toContain('DEVICE_REMOVAL')
  for (const { reason, refused } of seen.values()) {
    const error = await within(refused, BOUND_MS, 'a send from the handler') as RdmaError
    expect(error.code).toBe('ERR_QP_STATE')
    expect((error.cause as RdmaError).code).toBe(reason === 'DEVICE_REMOVAL' ? 'ERR_DEVICE_REMOVED' : 'ECONNRESET')
  }
  for (const conn of [client, server]) {
    expect(conn.closed).toBe(true)
    expect(conn.qp.closed).toBe(true)
    conn.close() // returns: already closed
    await within(conn.disconnect(), BOUND_MS, 'disconnect() after the removal')
  }

  // The kernel lets the delete finish only once no context of ours is open on the device.
  expect(await within(deleting, BOUND_MS, 'rdma link delete (blocked while a context on the device is open)')).toBe(0)
  deleting = undefined
  expect(filesOnRemovedDevices()).toEqual([])
  expect(hasDevice()).toBe(false)
  opened = []
}, 5 * BOUND_MS)
