// The order of an RDMA link's incoming notices (lib/transfer/notices.ts,
// NoticeOrder): the parts of each notice (its message on one QP, markers on
// the others) and the skips of failed transfers arrive in any order the
// QPs allow; whole notices come out in number order, each only once all its
// parts are in, the skipped never, and late markers of a skipped number are
// ignored (a failed one whose parts all went out may still come out).
// Property-based, numbers starting anywhere (the 31-bit wrap too).
import { describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { NoticeOrder } from '../../lib/transfer/notices.js'

const SKIP = 0x80000000
const MASK = 0x7fffffff

interface Piece { seq: number; kind: 'message' | 'marker' | 'skip'; qp: number }

const scenarios = fc.record({
  first: fc.oneof(fc.constant(0), fc.constant(MASK - 3), fc.integer({ min: 0, max: MASK })),
  notices: fc.array(fc.record({ parts: fc.integer({ min: 1, max: 4 }), failed: fc.boolean(), posted: fc.array(fc.boolean(), { minLength: 4, maxLength: 4 }) }), { minLength: 1, maxLength: 30 }),
  shuffle: fc.array(fc.nat(), { minLength: 200, maxLength: 200 }),
})

describe('notice order', () => {
  it('delivers every notice that did not fail, in number order, each once all its parts arrived; skips and late markers never block or deliver', () => {
    fc.assert(fc.property(scenarios, ({ first, notices, shuffle }) => {
      const pieces: Piece[] = []
      notices.forEach((n, i) => {
        const seq = (first + i) & MASK
        for (let q = 0; q < n.parts; q++) {
          // A failed transfer posted some of its last batches (the message rides on QP 0).
          if (n.failed && !n.posted[q]) continue
          pieces.push({ seq, kind: q === 0 ? 'message' : 'marker', qp: q })
        }
        if (n.failed) pieces.push({ seq, kind: 'skip', qp: 0 })
      })
      // Any interleaving, except that a skip comes after its own message (both on QP 0, in order).
      const order = pieces.map((p, i) => ({ p, key: shuffle[i % shuffle.length]! * 1000 + i })).sort((a, b) => a.key - b.key).map((x) => x.p)
      for (let i = 0; i < order.length; i++) {
        const skip = order[i]!
        if (skip.kind !== 'skip') continue
        const at = order.findIndex((p) => p.seq === skip.seq && p.kind === 'message')
        if (at > i) { order.splice(i, 1); order.splice(at, 0, skip); i-- }
      }
      const arrived = new Map<number, number>()
      const delivered: string[] = []
      const early: string[] = []
      const ordering = new NoticeOrder((message) => {
        const i = Number(message)
        if ((arrived.get((first + i) & MASK) ?? 0) < notices[i]!.parts) early.push(String(message))
        delivered.push(String(message))
      }, first)
      for (const p of order) {
        arrived.set(p.seq, (arrived.get(p.seq) ?? 0) + (p.kind === 'skip' ? 0 : 1))
        const index = (p.seq - first) & MASK
        if (p.kind === 'skip') ordering.arrived((SKIP | p.seq) >>> 0, undefined)
        else ordering.arrived(p.seq, p.kind === 'message' ? { parts: notices[index]!.parts, message: String(index) } : undefined)
      }
      expect(early).toEqual([])
      // A failed transfer whose parts all went out may still be delivered (its skip came after them): the others never.
      const indexes = delivered.map(Number)
      expect(indexes, 'in number order').toEqual([...indexes].sort((a, b) => a - b))
      expect(indexes.filter((i) => !notices[i]!.failed || notices[i]!.posted.slice(0, notices[i]!.parts).every(Boolean)), 'only whole ones').toEqual(indexes)
      expect(notices.flatMap((n, i) => n.failed ? [] : [i]).filter((i) => !indexes.includes(i)), 'every one that did not fail').toEqual([])
      expect(ordering.waiting, 'nothing left waiting once every number is delivered or skipped').toBe(0)
    }), { numRuns: 500 })
  })

  it('a notice sent twice, or with more markers than parts, is a protocol error', () => {
    const twice = new NoticeOrder(() => undefined)
    twice.arrived(1, { parts: 1, message: 'a' })
    expect(() => twice.arrived(1, { parts: 1, message: 'a' })).toThrow(expect.objectContaining({ code: 'ERR_TRANSFER_PROTOCOL' }))
    const extra = new NoticeOrder(() => undefined)
    extra.arrived(1, undefined)
    extra.arrived(1, undefined)
    expect(() => extra.arrived(1, { parts: 2, message: 'b' })).toThrow(expect.objectContaining({ code: 'ERR_TRANSFER_PROTOCOL' }))
  })
})
