// The bitmap arithmetic of agent.resume() (lib/transfer/resume.ts), at any
// block count (not only multiples of 8): the rest is exactly the blocks whose
// bit is clear, in order, as references (a list) or offset columns
// (BlockArrays); a report over the rest maps back onto the original indexes
// and is merged with what had landed before.
import { describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { merged, rest } from '../../lib/transfer/resume.js'
import type { Block, BlockArrays } from '../../lib/transfer/plan.js'

const bit = (bitmap: Uint8Array, i: number): boolean => ((bitmap[i >> 3]! >> (i & 7)) & 1) === 1
function bitmapOf(bits: boolean[]): Uint8Array {
  const out = new Uint8Array(Math.ceil(bits.length / 8))
  bits.forEach((b, i) => { if (b) out[i >> 3] |= 1 << (i & 7) })
  return out
}

const case_ = fc.integer({ min: 1, max: 300 }).chain((n) => fc.record({
  n: fc.constant(n),
  base: fc.array(fc.boolean(), { minLength: n, maxLength: n }),
  later: fc.array(fc.boolean(), { minLength: n, maxLength: n }),
  lengths: fc.array(fc.integer({ min: 1, max: 1 << 20 }), { minLength: n, maxLength: n }),
}))

describe('resume: the rest and the merged report', () => {
  it('property: a list\'s rest is its unlanded blocks (the same objects), and the merged report is the union over the original indexes', () => {
    fc.assert(fc.property(case_, ({ n, base, later, lengths }) => {
      const blocks: Block[] = lengths.map((length, i) => ({ local: ['l', i], remote: ['r', i * 7], length }))
      const r = rest(blocks, bitmapOf(base))
      const expected = blocks.filter((_, i) => !base[i])
      expect(r.count).toBe(expected.length)
      expect((r.blocks as Block[]).every((b, k) => b === expected[k])).toBe(true)
      // The resumed run lands some of the rest (bits over the rest's indexes).
      const part = bitmapOf((r.index ? Array.from(r.index) : blocks.map((_, i) => i)).map((i) => later[i]!))
      const report = merged(blocks, bitmapOf(base), part, r.index)
      const union = blocks.map((_, i) => base[i]! || (!base[i] && later[i]!))
      expect(report.landedBlocks.length).toBe(Math.ceil(n / 8))
      for (let i = 0; i < n; i++) expect(bit(report.landedBlocks, i)).toBe(union[i])
      expect(report.blocksLanded).toBe(union.filter(Boolean).length)
      expect(report.bytesLanded).toBe(lengths.reduce((sum, len, i) => sum + (union[i] ? len : 0), 0))
    }), { numRuns: 300 })
  })

  it('property: BlockArrays\' rest is new offset columns of the unlanded blocks, the caller\'s arrays untouched', () => {
    fc.assert(fc.property(case_, ({ n, base }) => {
      const localOffsets = Uint32Array.from({ length: n }, (_, i) => i * 4096)
      const remoteOffsets = Float64Array.from({ length: n }, (_, i) => 2 ** 40 + ((i * 37) % n) * 4096)
      const blocks: BlockArrays = { local: 'l', remote: 'r', localOffsets, remoteOffsets, blockSize: 4096 }
      const r = rest(blocks, bitmapOf(base))
      const keep = Array.from({ length: n }, (_, i) => i).filter((i) => !base[i])
      if (keep.length === n) {
        expect(r.blocks).toBe(blocks) // nothing landed: the caller's blocks as they are
        expect(r.index).toBeUndefined()
        return
      }
      const b = r.blocks as BlockArrays
      expect(Array.from(r.index!)).toEqual(keep)
      expect(Array.from(b.localOffsets)).toEqual(keep.map((i) => localOffsets[i]))
      expect(Array.from(b.remoteOffsets)).toEqual(keep.map((i) => remoteOffsets[i]))
      expect(b).toMatchObject({ local: 'l', remote: 'r', blockSize: 4096 })
      expect(merged(blocks, bitmapOf(base), undefined, r.index).bytesLanded).toBe((n - keep.length) * 4096)
    }), { numRuns: 300 })
  })
})
