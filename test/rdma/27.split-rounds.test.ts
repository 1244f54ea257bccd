// An operation longer than the port's max message size is split into pieces;
// when the pieces outnumber the send queue, they go out in rounds instead of
// being refused (a 10 GB KV-cache write on a queue of 128 must work).
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Device } from '../../dist/index.js'
import { connectedPair, pattern, testDevice } from './helpers.js'

let device: Device
beforeAll(() => { device = testDevice() })
afterAll(() => device?.close())

describe('split operations on a shallow send queue', () => {
  it('a write and a read of more pieces than the queue holds move every byte', async () => {
    const maxMessage = device.queryPort(1).maxMessageSize
    const length = 5 * maxMessage + 123 // 6 pieces on a queue of 4: rounds of 2
    const p = await connectedPair(device, { size: length + 4096, qp: { maxSendWr: 4 } })
    try {
      const { a, b } = p
      expect(a.qp.caps.maxSendWr).toBeLessThan(6)
      const chunk = pattern(1 << 20, 7)
      for (let at = 0; at < length; at += chunk.length) {
        const n = Math.min(chunk.length, length - at)
        a.region.bytes.set(chunk.subarray(0, n), at)
        a.region.bytes[at] = (at / chunk.length) & 0xff // each MiB differs: misplacement shows
      }
      b.region.bytes.fill(0xee)
      await a.qp.write(a.region.slice(0, length), b.region.asRemote().slice(4096, length), { timeoutMs: 120_000 })
      expect(Buffer.compare(b.region.bytes.subarray(4096, 4096 + length), a.region.bytes.subarray(0, length))).toBe(0)
      expect(b.region.bytes[4095]).toBe(0xee)

      a.region.bytes.fill(0)
      await a.qp.read(a.region.slice(0, length), b.region.asRemote().slice(4096, length), { timeoutMs: 120_000 })
      expect(Buffer.compare(a.region.bytes.subarray(0, length), b.region.bytes.subarray(4096, 4096 + length))).toBe(0)
      expect(a.qp.outstanding).toBe(0)
    } finally {
      p.close()
    }
  }, 300_000)
})
