// The ACK timeout of a connection's QP (options.ackTimeout of connect() and
// accept()). Without it rdma_cm derives the timeout from the path: on RoCE,
// Linux gives 19 (2.1 s), so every packet lost on the wire costs a READ 2.1 s
// before rxe asks again; under 1% loss a 1 MiB READ took 34 s where
// ib_read_bw (timeout 14) took 2 s (docs/reliability.md). Each side sets its
// own timeout; it is not negotiated.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Access, connect, listen, type Connection, type Device, type ProtectionDomain } from '../../dist/index.js'
import { pattern, testDevice } from './helpers.js'
import { countAll, countResources } from './resources.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
let device: Device
let pd: ProtectionDomain

beforeAll(() => {
  device = testDevice()
  pd = device.allocPd()
})
afterAll(() => device?.close())

/** A connection to a listener in this process with these ackTimeouts, and the one the listener accepted. */
async function pair(client: number | undefined, server: number | undefined): Promise<{ client: Connection; server: Connection; close: () => void }> {
  const listener = await listen({ host, port: 0, pd })
  try {
    const accepted = new Promise<Connection>((resolve, reject) => {
      listener.once('request', (request) => { request.accept({ timeoutMs: 30_000, ...(server === undefined ? {} : { ackTimeout: server }) }).then(resolve, reject) })
    })
    const c = await connect({ host, port: listener.address!.port, pd, timeoutMs: 30_000, ...(client === undefined ? {} : { ackTimeout: client }) })
    const s = await accepted
    return { client: c, server: s, close: () => { c.close(); s.close(); listener.close() } }
  } catch (error) {
    listener.close()
    throw error
  }
}

describe('connect()/accept() ackTimeout', () => {
  it('sets the QP timeout of each side to its own value, and the connection moves verified bytes', async () => {
    const p = await pair(14, 12)
    try {
      expect(p.client.qp.query().timeout).toBe(14)
      expect(p.server.qp.query().timeout).toBe(12)
      const mine = pd.allocRegion(8192)
      const theirs = pd.allocRegion(8192, Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead)
      try {
        mine.bytes.set(pattern(4096, 66))
        await p.client.qp.write(mine.slice(0, 4096), theirs.asRemote().slice(0, 4096), { timeoutMs: 30_000 })
        await p.client.qp.read(mine.slice(4096, 4096), theirs.asRemote().slice(0, 4096), { timeoutMs: 30_000 })
        expect(Buffer.compare(mine.bytes.subarray(4096), pattern(4096, 66))).toBe(0)
      } finally {
        mine.deregister()
        theirs.deregister()
      }
    } finally {
      p.close()
    }
  })

  it("without it, the QP keeps the timeout rdma_cm derived from the path (printed: the kernel's choice)", async () => {
    const p = await pair(undefined, undefined)
    try {
      const [c, s] = [p.client.qp.query().timeout, p.server.qp.query().timeout]
      console.log(`rdma_cm's own ACK timeout: client ${c}, server ${s}`)
      expect(c).toEqual(expect.any(Number))
      expect(s).toBe(c)
    } finally {
      p.close()
    }
  })

  it('refuses values that are not an exponent from 0 to 31 with a coded error before connecting, and leaves nothing behind', async () => {
    const counts = () => ({ ...countAll(), cmId: countResources('cm_id') })
    const before = counts()
    for (const bad of [32, -1, 1.5, '14', null]) {
      const error = await connect({ host, port: 1, pd, ackTimeout: bad as number, timeoutMs: 5_000 }).then(() => null, (e: unknown) => e)
      expect(error, String(bad)).toMatchObject({ code: typeof bad === 'number' ? 'ERR_OUT_OF_RANGE' : 'ERR_INVALID_ARG_TYPE' })
    }
    const listener = await listen({ host, port: 0, pd })
    try {
      const refused = new Promise<unknown>((resolve) => {
        listener.once('request', (request) => { request.accept({ ackTimeout: 99 }).then(() => null, (e: unknown) => e).then(resolve) })
      })
      const client = connect({ host, port: listener.address!.port, pd, timeoutMs: 30_000 }).then(() => null, (e: unknown) => e)
      expect(await refused).toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
      expect(await client).toMatchObject({ code: expect.any(String) }) // the request was closed: the client is refused
    } finally {
      listener.close()
    }
    expect(counts()).toEqual(before)
  })
})
