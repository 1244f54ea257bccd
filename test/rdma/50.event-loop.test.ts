// Completions arrive on the event loop without blocking it.
import { describe, expect, it } from 'vitest'
import { connectedPair, testDevice } from './helpers.js'

describe('event loop', () => {
  it.each(['event', 'busy'] as const)('timers keep firing while thousands of operations complete (%s polling)', async (pollMode) => {
    const device = testDevice()
    const { a, b, close } = await connectedPair(device, { pollMode })
    const total = 5000
    let completed = 0
    const seenDuring: number[] = []
    const timer = setInterval(() => { if (completed > 0 && completed < total) seenDuring.push(completed) }, 1)
    const remote = b.region.asRemote()
    await Promise.all(Array.from({ length: total }, (_, i) =>
      a.qp.write(a.region.slice((i % 256) * 64, 64), remote.slice((i % 256) * 64, 64)).then(() => { completed++ })))
    clearInterval(timer)
    expect(completed).toBe(total)
    // The timer ran between completions at least twice, at different points.
    expect(new Set(seenDuring).size).toBeGreaterThanOrEqual(2)
    close()
    device.close()
  })

  /** Resolves once `done()` holds, checked every 5 ms; rejects after `ms`. */
  async function until(done: () => boolean, what: string, ms = 20_000): Promise<void> {
    const end = Date.now() + ms
    while (!done()) {
      if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`)
      await new Promise((r) => setTimeout(r, 5))
    }
  }

  it('an idle busy queue stops polling from the loop, and wakes for a message and for a post', async () => {
    const device = testDevice()
    const { a, b, close } = await connectedPair(device, { pollMode: 'busy' })
    try {
      // A receive posted ahead (a server's) and nothing arriving: the loop polls for idleMicros (10 ms), then waits on the channel.
      const inbox = b.region.slice(0, 64)
      const received = b.qp.recv(inbox)
      expect(b.cq.spinning).toBe(true)
      await until(() => !b.cq.spinning, 'the idle busy queue parks')
      expect(b.cq.pending).toBe(1)
      // A message arriving while it waits on the channel is delivered, and the queue polls again.
      a.region.bytes.fill(0x5a, 0, 64)
      await a.qp.send(a.region.slice(0, 64))
      const wc = await received
      expect(wc.byteLength).toBe(64)
      expect(Buffer.from(inbox.bytes).equals(Buffer.alloc(64, 0x5a))).toBe(true)
      // Parked again, a post on the queue's own QP wakes it: the write completes and lands.
      const next = b.qp.recv(inbox)
      await until(() => !b.cq.spinning, 'the busy queue parks again')
      b.region.bytes.fill(0x33, 128, 192)
      const write = b.qp.write(b.region.slice(128, 64), a.region.asRemote().slice(128, 64))
      expect(b.cq.spinning).toBe(true)
      await write
      expect(Buffer.from(a.region.bytes.subarray(128, 192)).equals(Buffer.alloc(64, 0x33))).toBe(true)
      await a.qp.send(a.region.slice(0, 8))
      expect((await next).byteLength).toBe(8)
    } finally {
      close()
      device.close()
    }
  })

  it('a busy queue with idleMicros 0 polls as long as requests wait; a bad idleMicros is a RangeError', async () => {
    const device = testDevice()
    try {
      expect(() => device.createCq({ pollMode: 'busy', idleMicros: -1 })).toThrow(RangeError)
      expect(() => device.createCq({ pollMode: 'busy', idleMicros: 1.5 })).toThrow(/idleMicros/)
      const pd = device.allocPd()
      const cq = device.createCq({ pollMode: 'busy', idleMicros: 0 })
      const qp = pd.createQp({ type: 'RC', sendCq: cq })
      const region = pd.allocRegion(4096)
      const peerCq = device.createCq()
      const peer = pd.createQp({ type: 'RC', sendCq: peerCq })
      await qp.connect(peer.endpoint())
      await peer.connect(qp.endpoint())
      const received = qp.recv(region.slice(0, 64))
      // Ten times the default idle time with nothing arriving: still polling.
      await new Promise((r) => setTimeout(r, 100))
      expect(cq.spinning).toBe(true)
      await peer.send(region.slice(64, 64))
      expect((await received).byteLength).toBe(64)
      for (const r of [qp, peer, cq, peerCq, region, pd]) r.close()
    } finally {
      device.close()
    }
  })
})
