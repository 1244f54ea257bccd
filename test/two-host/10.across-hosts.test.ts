// Across two machines (two guests, two kernels, a virtual wire): guest 0
// listens, guest 1 connects with rdma_cm and moves verified data; then a QP
// pair connected the verbs way (endpoints exchanged as JSON) moves more.
import { describe, expect, it } from 'vitest'
import { Access, decodeDescriptors, listen, openDevice, remoteRegion, type Connection } from '../../dist/index.js'
import { serve } from '../rdma/fixtures/cm-serve.mjs'
import { exchange } from '../rdma/cm-helpers.js'
import { pattern } from '../rdma/helpers.js'

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
        // Serve until the client says it is done.
        const listener = await listen({ host: local!, port: PORT, pd })
        await new Promise<void>((resolve) => listener.on('request', (request) => { serve(request, pd, { onDone: resolve }).catch(() => {}) }))
        await new Promise((resolve) => setTimeout(resolve, 500)) // let the reply reach the client
        listener.close()
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
