// recvMany(): several receive buffers posted with one call, one promise each.
// The messages land in order, each in its own buffer; argument errors throw
// with nothing posted; the batch waits for queue slots; closing rejects them.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Access, type Device } from '../../dist/index.js'
import { connectedPair, pattern, srqPair, testDevice, within } from './helpers.js'
import { thrown } from '../unit/thrown.js'

let device: Device
beforeAll(() => { device = testDevice() })
afterAll(() => device?.close())

describe('recvMany', () => {
  it('posts the buffers in order: each message lands in its own buffer and resolves its own promise', async () => {
    const { a, b, close } = await connectedPair(device, { size: 1 << 16, qp: { maxRecvSge: 2 } })
    try {
      const receives = b.qp.recvMany(Array.from({ length: 8 }, (_, i) => b.region.slice(1024 * i, 1024)))
      expect(receives).toHaveLength(8)
      expect(b.qp.outstanding).toBe(8)
      expect(b.region.inflight).toBe(8)
      for (let i = 0; i < 8; i++) {
        a.region.bytes.set(pattern(100 + i, i), 8192 + 1024 * i)
        await within(a.qp.send(a.region.slice(8192 + 1024 * i, 100 + i)))
      }
      const completions = await within(Promise.all(receives))
      for (let i = 0; i < 8; i++) {
        expect(completions[i]!.byteLength).toBe(100 + i)
        expect(Buffer.compare(b.region.bytes.subarray(1024 * i, 1024 * i + 100 + i), pattern(100 + i, i))).toBe(0)
      }
      expect(new Set(completions.map((c) => c.wrId)).size).toBe(8)
      expect(b.qp.outstanding).toBe(0)
      expect(b.region.inflight).toBe(0)
      // A buffer of several slices (scatter), and an empty batch.
      const [scattered] = b.qp.recvMany([[b.region.slice(0, 10), b.region.slice(100, 90)]])
      a.region.bytes.set(pattern(100, 9), 8192)
      await within(a.qp.send(a.region.slice(8192, 100)))
      expect((await within(scattered!)).byteLength).toBe(100)
      expect(Buffer.compare(Buffer.concat([b.region.bytes.subarray(0, 10), b.region.bytes.subarray(100, 190)]), pattern(100, 9))).toBe(0)
      expect(b.qp.recvMany([])).toEqual([])
    } finally {
      close()
    }
  })

  it('refuses bad arguments by throwing, with nothing posted', async () => {
    const { b, close } = await connectedPair(device, { size: 4096 })
    const otherPd = device.allocPd()
    try {
      const foreign = otherPd.allocRegion(4096, Access.LocalWrite)
      expect(thrown(() => b.qp.recvMany([b.region.slice(0, 64), foreign.slice(0, 64)])).code).toBe('ERR_WRONG_PD')
      expect(thrown(() => b.qp.recvMany(b.region.slice(0, 64) as never)).code).toBe('ERR_INVALID_ARG_TYPE')
      expect(thrown(() => b.qp.recvMany([b.region.slice(0, 64), 'x' as never])).code).toBe('ERR_INVALID_ARG_TYPE')
      expect(thrown(() => b.qp.recvMany(Array.from({ length: 257 }, () => b.region.slice(0, 8)))).code).toBe('ERR_OUT_OF_RANGE')
      expect(b.qp.outstanding).toBe(0)
      expect(b.region.inflight).toBe(0)
    } finally {
      otherPd.close()
      close()
    }
  })

  it('waits for receive slots as one batch; closing the QP rejects every receive and frees the buffers', async () => {
    const { a, b, close } = await connectedPair(device, { size: 4096, qp: { maxRecvWr: 4 } })
    try {
      const first = b.qp.recvMany([0, 1, 2].map((i) => b.region.slice(64 * i, 64)))
      const waiting = b.qp.recvMany([3, 4].map((i) => b.region.slice(64 * i, 64))) // 5 > 4: waits for a slot
      expect(b.qp.outstanding).toBe(3)
      await within(a.qp.send(a.region.slice(0, 8)))
      await within(first[0]!)
      await within(new Promise((resolve) => setImmediate(resolve)))
      expect(b.qp.outstanding).toBe(4) // the two of the waiting batch, posted together
      const closing = [...first.slice(1), ...waiting].map((p) => p.catch((e: { code: string }) => e.code))
      b.qp.close()
      expect(await within(Promise.all(closing))).toEqual(['ERR_CLOSED', 'ERR_CLOSED', 'ERR_CLOSED', 'ERR_CLOSED'])
      expect(b.region.inflight).toBe(0)
      expect(thrown(() => b.qp.recvMany([b.region.slice(0, 8)])).code).toBe('ERR_CLOSED')
    } finally {
      close()
    }
  })

  it('an SRQ posts a batch its QPs receive into', async () => {
    const { srq, region, receiver, sender, close } = await srqPair(device, 8192)
    try {
      const receives = srq.recvMany([0, 1, 2, 3].map((i) => region.slice(1024 * i, 1024)))
      for (let i = 0; i < 4; i++) {
        region.bytes.set(pattern(50 + i, 20 + i), 4096 + 1024 * i)
        await within(sender.send(region.slice(4096 + 1024 * i, 50 + i)))
      }
      const completions = await within(Promise.all(receives))
      for (let i = 0; i < 4; i++) {
        expect(completions[i]).toMatchObject({ byteLength: 50 + i, qpn: receiver.qpn })
        expect(Buffer.compare(region.bytes.subarray(1024 * i, 1024 * i + 50 + i), pattern(50 + i, 20 + i))).toBe(0)
      }
      expect(thrown(() => receiver.recvMany([region.slice(0, 8)])).code).toBe('ERR_QP_SRQ')
      // More buffers than the SRQ has room for: the provider refuses one; the
      // ones before it stay posted, it and the rest reject with its error.
      const room = srq.query().maxWr
      const flood = srq.recvMany(Array.from({ length: room + 4 }, () => region.slice(0, 8))).map((p) => p.catch((e: { code: string }) => e.code))
      srq.close()
      const codes = await within(Promise.all(flood))
      const refusedAt = codes.indexOf('ENOMEM')
      expect(refusedAt).toBeGreaterThan(0)
      expect(codes.slice(0, refusedAt)).toEqual(Array(refusedAt).fill('ERR_CLOSED'))
      expect(codes.slice(refusedAt)).toEqual(Array(codes.length - refusedAt).fill('ENOMEM'))
      expect(region.inflight).toBe(0)
    } finally {
      close()
    }
  })
})
