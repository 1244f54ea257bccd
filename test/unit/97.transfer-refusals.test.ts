// Hostile arguments to the transfer agent and the lock table that the engine
// fuzzer (rdma/107) found uncoded or silently accepted: each is refused with
// ERR_INVALID_ARG_TYPE (or the segment's own code), nothing moves. TCP
// transport: no device needed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { RemoteLockTable, TransferAgent, remoteRegion, type Peer, type QueuePair } from '../../dist/index.js'

let a: TransferAgent
let b: TransferAgent
let peer: Peer

beforeAll(async () => {
  a = await TransferAgent.create({ host: '127.0.0.1', port: 0, transport: 'tcp', name: 'refusals-a' })
  b = await TransferAgent.create({ host: '127.0.0.1', port: 0, transport: 'tcp', name: 'refusals-b' })
  b.register('dst', { size: 4096, remote: 'read-write' })
  a.register('src', { size: 4096 })
  peer = await a.connect({ host: '127.0.0.1', port: b.port })
})
afterAll(async () => { await a?.close(); await b?.close() })

const TYPE = { code: 'ERR_INVALID_ARG_TYPE' }
const NOT_PEERS: unknown[] = [null, undefined, 7, {}, 'refusals-b']

describe('hostile arguments to the transfer agent and the lock table', () => {
  it('write()/read() refuse blocks that are not blocks (falsy values, a function): before, falsy ones resolved with nothing moved', async () => {
    for (const blocks of [undefined, null, 0, '', false, NaN, 0n, () => [{ local: ['src', 0], remote: ['dst', 0], length: 8 }]]) {
      await expect(a.write(peer, blocks as never), String(blocks)).rejects.toMatchObject(TYPE)
      await expect(a.read(peer, blocks as never), String(blocks)).rejects.toMatchObject(TYPE)
    }
    expect(a.stats().total.bytes).toBe(0)
    expect(a.stats().total.transfers).toBe(0)
  })

  it('prepare() and closePeer() refuse what is not a Peer of the agent (coded, not a TypeError of a property read)', () => {
    for (const p of NOT_PEERS) {
      expect(() => a.prepare(p as never, 'write', [{ local: ['src', 0], remote: ['dst', 0], length: 8 }]), String(p)).toThrow(expect.objectContaining(TYPE))
      expect(() => a.closePeer(p as never), String(p)).toThrow(expect.objectContaining(TYPE))
    }
    expect(peer.state).toBe('connected')
  })

  it('a segment named by a bigint is unknown (ERR_SEGMENT_UNKNOWN), not a failure to show it in the message', async () => {
    await expect(a.unregister(2n ** 64n as never)).rejects.toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
    await expect(a.write(peer, [{ local: [1n, 0], remote: ['dst', 0], length: 8 }] as never)).rejects.toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
    await expect(a.write(peer, [{ local: ['src', 0], remote: [1n, 0], length: 8 }] as never)).rejects.toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
  })

  it('RemoteLockTable release()/renew() refuse a grant that is not an object, before any atomic is posted', async () => {
    let posted = 0
    const qp = { compareAndSwap: async () => { posted++; return 0n }, fetchAndAdd: async () => { posted++; return 0n } }
    const region = remoteRegion({ version: 1, addr: '0x1000', rkey: 1, length: 64 })
    const table = new RemoteLockTable(qp as unknown as QueuePair, { locks: region.slice(0, 16), tokens: region.slice(16, 16), owner: 1 })
    for (const grant of [null, undefined, 7, 'x']) {
      await expect(table.release(grant as never), String(grant)).rejects.toMatchObject(TYPE)
      await expect(table.renew(grant as never), String(grant)).rejects.toMatchObject(TYPE)
    }
    expect(posted).toBe(0)
  })
})
