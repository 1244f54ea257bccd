// The transfer engine across two machines: host 1 writes 256 MiB as random
// blocks (random sizes, scattered over the far segment) into host 0's
// segment with a notification; host 0 checks every block in the notification
// handler and answers with the count of wrong blocks.
import { describe, expect, it } from 'vitest'
import { TransferAgent, type Block, type Notification, type Peer } from '../../dist/index.js'
import { pattern, scatter, within } from '../rdma/helpers.js'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peerAddr = process.env.SOFTROCE_PEER_ADDR
const PORT = 7482
const SIZE = 256 << 20
const SEED = 20
/**
 * The data QPs' ACK timeout: 2^18 x 4.096 us = 1.07 s. With the default 14
 * (67 ms) the emulated guests answer late, the writer's rxe retransmits
 * spuriously, and rxe 6.1's retransmission can shift the PSNs of a write by
 * one (a zero-length WRITE ONLY): the far side then NAKs "invalid request"
 * (REM_INV_REQ_ERR). See docs/softroce.md, "Retransmission on Soft-RoCE".
 */
const ACK_TIMEOUT = 18

/** Blocks of 4 KiB..1 MiB over SIZE bytes, destinations shuffled. */
const layout = (seed: number) => scatter(SIZE, seed, 256)

/**
 * Block i's bytes: a 4093-byte tile of its own, repeated (a native fill: a JS
 * loop over 256 MiB takes minutes in the emulated guest). 4093 is prime, so
 * a slice landing at another 64 KiB step of its block shows as wrong bytes.
 */
function blockBytes(i: number, length: number): Buffer {
  return Buffer.alloc(length).fill(pattern(4093, SEED * 100_000 + i))
}

describe(`transfer engine across two hosts (this is host ${role})`, () => {
  it('256 MiB in random blocks, verified on the far side', async () => {
    expect(role === '0' || role === '1', 'SOFTROCE_HOST_INDEX').toBe(true)
    const blocks = layout(SEED)
    if (role === '0') {
      const agent = await TransferAgent.create({ host: local!, port: PORT, name: 'decode', ackTimeout: ACK_TIMEOUT })
      try {
        const kv = agent.register('kv', { size: SIZE, remote: 'read-write' })
        const notification = await within(new Promise<Notification>((resolve) => agent.once('notification', resolve)), 330_000, 'the writer\'s notification')
        expect(notification.message).toBe(`written ${SEED}`)
        // The data is in place when the notification arrives: check every block now.
        let wrong = 0
        blocks.forEach((b, i) => {
          if (Buffer.compare(kv.bytes.subarray(b.dst, b.dst + b.length), blockBytes(i, b.length)) !== 0) wrong++
        })
        await agent.notify(notification.peer, `wrong ${wrong}`, { timeoutMs: 30_000 })
        expect(wrong, `blocks with other bytes, of ${blocks.length}`).toBe(0)
        // Let the writer read the answer before this side goes away.
        await within(new Promise((resolve) => agent.once('peerLost', resolve)), 60_000, 'the writer to disconnect')
      } finally {
        agent.close()
      }
    } else {
      const agent = await TransferAgent.create({ host: local!, port: 0, name: 'prefill', qpsPerPeer: 4, ackTimeout: ACK_TIMEOUT })
      try {
        const src = agent.register('src', { size: SIZE })
        blocks.forEach((b, i) => src.bytes.set(blockBytes(i, b.length), b.src))
        let peer: Peer | undefined
        for (let attempt = 0; !peer; attempt++) { // host 0 may still be booting
          try {
            peer = await agent.connect({ host: peerAddr!, port: PORT, timeoutMs: 10_000 })
          } catch (error) {
            if (attempt > 120) throw error
            await new Promise((resolve) => setTimeout(resolve, 500))
          }
        }
        await within((async () => { while (!peer!.segments.has('kv')) await new Promise((r) => setTimeout(r, 20)) })(), 30_000, 'the kv segment')
        const answer = new Promise<Notification>((resolve) => agent.once('notification', resolve))
        const list: Block[] = blocks.map((b) => ({ local: [src, b.src], remote: ['kv', b.dst], length: b.length }))
        const result = await agent.write(peer, list, { notify: `written ${SEED}`, timeoutMs: 300_000 })
        expect(result).toMatchObject({ bytes: SIZE, blocks: blocks.length, qps: 4 })
        console.log(`two-host transfer: ${SIZE} bytes in ${blocks.length} blocks, ${result.workRequests} work requests, ${result.ms.toFixed(0)} ms`)
        expect((await within(answer, 120_000, 'host 0\'s verdict')).message).toBe('wrong 0')
      } finally {
        agent.close()
      }
    }
  }, 420_000)
})
