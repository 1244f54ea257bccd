// Across two machines (two guests, two kernels, a virtual wire): guest 0
// listens, guest 1 connects with rdma_cm and moves verified data; then a QP
// pair connected the verbs way (endpoints exchanged as JSON) moves more.
import { describe, expect, it } from 'vitest'
import { Access, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, type Connection, type ConnectionRequest, type ProtectionDomain, type QueuePair } from '../../dist/index.js'
import { exchange } from '../rdma/cm-helpers.js'
import { ALL_ACCESS, pattern } from '../rdma/helpers.js'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peer = process.env.SOFTROCE_PEER_ADDR
const PORT = 7471

describe(`two hosts (this is host ${role})`, () => {
  it('runs where two hosts were provided', () => {
    expect(role === '0' || role === '1', 'SOFTROCE_HOST_INDEX').toBe(true)
    expect(local && peer, 'SOFTROCE_ADDR and SOFTROCE_PEER_ADDR').toBeTruthy()
  })

  it('rdma_cm connections and a hand-made QP pair move verified data across hosts', async () => {
    const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
    const pd = device.allocPd()
    try {
      if (role === '0') {
        // Serve every connection the client makes, and check on this side what arrived.
        const listener = await listen({ host: local!, port: PORT, pd })
        const served: Array<Promise<void>> = []
        const seeds: number[] = []
        let clientDone!: () => void
        const done = new Promise<void>((resolve) => { clientDone = resolve })
        // A failure on this side is printed at once (the client only sees its
        // connection drop), and fails the test below.
        listener.on('request', (request) => served.push(serveAndCheck(request, pd, seeds, clientDone).catch((error) => {
          console.error('host 0: serving a connection failed:', error)
          throw error
        })))
        try {
          await within(done, 150_000, 'the client to say it is done')
          // Each connection ends when the client disconnects it; any failure on this side fails here.
          await within(Promise.all(served), 60_000, 'every connection to end')
        } finally {
          listener.close()
        }
        expect(served.length, 'connections accepted').toBe(9)
        expect(seeds.sort((a, b) => a - b), 'patterns that arrived by WRITE').toEqual([1, 10, 11, 12, 13, 14, 15, 16, 17])
      } else {
        // The server may still be booting: retry refused connections for a while.
        let first: Connection | undefined
        for (let attempt = 0; !first; attempt++) {
          try {
            first = await exchange(peer!, PORT, pd, 1)
          } catch (error) {
            if ((error as { code?: string }).code !== 'ECONNREFUSED' || attempt > 120) throw error
            await new Promise((resolve) => setTimeout(resolve, 500))
          }
        }
        const more = await Promise.all(Array.from({ length: 8 }, (_, i) => exchange(peer!, PORT, pd, 10 + i)))
        // A large transfer over the wire, verified by reading it back.
        const remote = remoteRegion(decodeDescriptors(first.privateData)[0])
        const big = pd.allocRegion(2 * 65536, Access.LocalWrite)
        big.bytes.set(pattern(65536, 77))
        await first.qp.write(big.slice(0, 65536), remote.slice(0, 65536))
        await first.qp.read(big.slice(65536, 65536), remote.slice(0, 65536))
        expect(Buffer.compare(big.bytes.subarray(65536), pattern(65536, 77))).toBe(0)
        // A hand-made QP pair across the hosts: exchange endpoints, connect, WRITE and READ.
        const cq = device.createCq()
        const qp = pd.createQp({ type: 'RC', sendCq: cq })
        await first.sendJson({ endpoint: qp.endpoint() })
        const { endpoint } = (await first.receiveJson()) as { endpoint: Parameters<typeof qp.connect>[0] }
        expect(endpoint.gid).toBe(`::ffff:${peer}`)
        await qp.connect(endpoint)
        big.bytes.set(pattern(4096, 78))
        await qp.write(big.slice(0, 4096), remote.slice(8192, 4096))
        await qp.read(big.slice(65536, 4096), remote.slice(8192, 4096))
        expect(Buffer.compare(big.bytes.subarray(65536, 65536 + 4096), pattern(4096, 78))).toBe(0)
        qp.close()
        cq.close()
        await first.sendJson({ done: true })
        expect(await first.receiveJson()).toEqual({ done: true })
        for (const conn of [first, ...more]) await conn.disconnect()
        big.deregister()
      }
    } finally {
      device.close()
    }
  })
})

/** Rejects with a message naming what was awaited if it takes longer than `ms`. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms) })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/**
 * Host 0's side of the protocol of test/rdma/fixtures/cm-serve.mjs (sum, echo,
 * endpoint, done), with checks: which pattern the client's exchange() wrote
 * (pushed to `seeds`), and at 'done' the bytes of the large WRITE and of the
 * hand-made QP's WRITE. Resolves when the client disconnects; rejects on any failure.
 */
async function serveAndCheck(request: ConnectionRequest, pd: ProtectionDomain, seeds: number[], onDone: () => void): Promise<void> {
  const region = pd.allocRegion(65536, ALL_ACCESS)
  const conn = await request.accept({ privateData: encodeDescriptors([region.describe()]), receiveJson: true })
  const disconnected = new Promise<null>((resolve) => conn.once('disconnected', () => resolve(null)))
  let qp: QueuePair | undefined
  const cq = pd.device.createCq()
  try {
    for (;;) {
      const next = conn.receiveJson()
      next.catch(() => {}) // flushed when the client disconnects: that ends the loop below
      const message = (await Promise.race([next, disconnected])) as Record<string, unknown> | null
      if (message === null) return
      if (message.sum) {
        const [offset, length] = message.sum as [number, number]
        const bytes = region.bytes.subarray(offset, offset + length)
        const seed = [1, 10, 11, 12, 13, 14, 15, 16, 17].find((s) => Buffer.compare(bytes, pattern(length, s)) === 0)
        expect(seed, `the bytes the client wrote at ${offset} match one of its patterns`).toBeDefined()
        seeds.push(seed!)
        let sum = 0
        for (const byte of bytes) sum = (sum * 31 + byte) >>> 0
        await conn.sendJson({ sum })
      } else if (message.echo !== undefined) {
        await conn.sendJson({ echo: message.echo })
      } else if (message.endpoint) {
        qp = pd.createQp({ type: 'RC', sendCq: cq })
        await qp.connect(message.endpoint as Parameters<QueuePair['connect']>[0])
        await conn.sendJson({ endpoint: qp.endpoint() })
      } else if (message.done) {
        // The client wrote pattern 77 over the region, then pattern 78 at 8192 through the hand-made QP.
        const expected = Buffer.from(pattern(65536, 77))
        expected.set(pattern(4096, 78), 8192)
        expect(Buffer.compare(region.bytes, expected), 'the region holds what the client wrote').toBe(0)
        await conn.sendJson({ done: true })
        onDone()
      } else {
        throw new Error(`unexpected message ${JSON.stringify(message)}`)
      }
    }
  } finally {
    qp?.close()
    cq.close()
    conn.close()
    region.deregister()
  }
}
