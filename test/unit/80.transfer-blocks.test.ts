// The transfer engine's pure block arithmetic: validation against both
// tables' bounds, coalescing, slicing and striping. Property-based: whatever
// the blocks, the slices cover exactly the same bytes, pairwise, and none is
// larger than the slice size.
import { describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { coalesce, emptyColumns, planSlices, remoteOrderIndexes, slice, stripe, validateColumns, type BlockColumns } from '../../lib/transfer/blocks.js'
import { thrown } from './thrown.js'

function columns(blocks: Array<[number, number, number, number, number]>): BlockColumns {
  const cols = emptyColumns(blocks.length)
  blocks.forEach(([ls, lo, rs, ro, len], i) => { cols.lseg[i] = ls; cols.loff[i] = lo; cols.rseg[i] = rs; cols.roff[i] = ro; cols.len[i] = len })
  return cols
}

function rows(cols: BlockColumns): Array<[number, number, number, number, number]> {
  return Array.from({ length: cols.count }, (_, i) => [cols.lseg[i]!, cols.loff[i]!, cols.rseg[i]!, cols.roff[i]!, cols.len[i]!])
}

/** Every byte as "lseg:loff->rseg:roff", sorted: the mapping a transfer performs. */
function byteMap(cols: BlockColumns): string[] {
  const out: string[] = []
  for (const [ls, lo, rs, ro, len] of rows(cols)) for (let k = 0; k < len; k++) out.push(`${ls}:${lo + k}>${rs}:${ro + k}`)
  return out.sort()
}

describe('emptyColumns', () => {
  it('gives every plan columns of its own, zeroed, whatever their size (small plans share slabs)', () => {
    // Sizes around each way of making them (own typed arrays up to 8, slab parts up to 128, a buffer of their own beyond),
    // enough of them to fill several 64 KiB slabs: each keeps what was written to it.
    const sizes = [1, 8, 9, 16, 100, 128, 129, 1000]
    const made: BlockColumns[] = []
    for (let k = 0; k < 600; k++) {
      const count = sizes[k % sizes.length]!
      const cols = emptyColumns(count)
      expect(cols.count).toBe(count)
      for (const column of [cols.lseg, cols.loff, cols.rseg, cols.roff, cols.len]) {
        expect(column.length).toBe(count)
        expect(column.every((v) => v === 0)).toBe(true)
      }
      for (let i = 0; i < count; i++) { cols.lseg[i] = k; cols.loff[i] = k + 0.5; cols.rseg[i] = k + 1; cols.roff[i] = k + 0.25; cols.len[i] = -k }
      made.push(cols)
    }
    made.forEach((cols, k) => {
      for (let i = 0; i < cols.count; i++) {
        expect([cols.lseg[i], cols.loff[i], cols.rseg[i], cols.roff[i], cols.len[i]], `plan ${k}, block ${i}`).toEqual([k, k + 0.5, k + 1, k + 0.25, -k])
      }
    })
  })
})

describe('validateColumns', () => {
  it('returns the total bytes of blocks inside both segments', () => {
    expect(validateColumns(columns([[0, 0, 0, 0, 10], [1, 5, 0, 90, 10]]), [10, 20], [100])).toBe(20)
  })

  it('refuses, with ERR_BLOCK_RANGE, blocks past either end, unknown segments, and bad numbers', () => {
    const cases: Array<[Array<[number, number, number, number, number]>, RegExp]> = [
      [[[0, 1, 0, 0, 10]], /local bytes 1..11 are outside the local segment \(10 bytes\)/],
      [[[0, 0, 0, 95, 10]], /remote bytes 95..105 are outside the remote segment \(100 bytes\)/],
      [[[2, 0, 0, 0, 1]], /names a segment that is not in the table/],
      [[[0, 0, 1, 0, 1]], /names a segment that is not in the table/],
      [[[0, 0, 0, 0, 0]], /length an integer >= 1/],
      [[[0, -1, 0, 0, 1]], /integers >= 0/],
      [[[0, 0.5, 0, 0, 1]], /integers >= 0/],
      [[[0, 0, 0, NaN, 1]], /integers >= 0/],
    ]
    for (const [blocks, message] of cases) {
      const error = thrown(() => validateColumns(columns(blocks), [10, 20], [100])) as { code: string; message: string }
      expect(error.code).toBe('ERR_BLOCK_RANGE')
      expect(error.message).toMatch(message)
    }
  })

  it('a withdrawn segment (length 0) refuses every block', () => {
    expect((thrown(() => validateColumns(columns([[0, 0, 0, 0, 1]]), [10], [0])) as { code: string }).code).toBe('ERR_BLOCK_RANGE')
  })
})

describe('coalesce', () => {
  it('merges blocks adjacent on both sides, even when given out of order', () => {
    const merged = coalesce(columns([[0, 8, 0, 108, 4], [0, 0, 0, 100, 4], [0, 4, 0, 104, 4]]))
    expect(rows(merged)).toEqual([[0, 0, 0, 100, 12]])
  })

  it('keeps apart blocks adjacent on one side only, or in other segments', () => {
    const kept = coalesce(columns([[0, 0, 0, 0, 4], [0, 4, 0, 8, 4], [1, 8, 0, 16, 4], [0, 12, 1, 20, 4]]))
    expect(kept.count).toBe(4)
  })
})

describe('remoteOrderIndexes', () => {
  it('orders blocks by (remote segment, remote offset), ties by index, as a comparator sort does: packed keys and the fallback for huge offsets', () => {
    const block = fc.tuple(fc.nat(3), fc.nat(2 ** 20), fc.nat(3), fc.oneof(fc.nat(2 ** 20), fc.nat(Number.MAX_SAFE_INTEGER - 2)), fc.integer({ min: 1, max: 64 }))
    fc.assert(fc.property(fc.array(block, { minLength: 1, maxLength: 300 }), (blocks) => {
      const cols = columns(blocks)
      const expected = Array.from({ length: cols.count }, (_, i) => i)
        .sort((a, b) => cols.rseg[a]! - cols.rseg[b]! || cols.roff[a]! - cols.roff[b]! || a - b)
      expect([...remoteOrderIndexes(cols)]).toEqual(expected)
    }), { numRuns: 300 })
  })
})

describe('slice', () => {
  it('cuts blocks into slices of at most maxBytes, in order', () => {
    expect(rows(slice(columns([[0, 0, 0, 1000, 10], [1, 3, 2, 0, 4]]), 4))).toEqual([
      [0, 0, 0, 1000, 4], [0, 4, 0, 1004, 4], [0, 8, 0, 1008, 2], [1, 3, 2, 0, 4],
    ])
  })
})

describe('stripe', () => {
  it('gives each QP a contiguous run of about equal bytes', () => {
    const cols = columns(Array.from({ length: 8 }, (_, i) => [0, i * 10, 0, i * 10, 10] as [number, number, number, number, number]))
    expect([...stripe(cols, 4)]).toEqual([0, 2, 4, 6, 8])
    expect([...stripe(cols, 3)]).toEqual([0, 3, 6, 8])
    expect([...stripe(columns([[0, 0, 0, 0, 5]]), 4)]).toEqual([0, 1, 1, 1, 1])
  })
})

describe('planSlices (property-based)', () => {
  it('moves exactly the bytes of the blocks, in slices no larger than asked, striped over the QPs', () => {
    const block = fc.record({ lseg: fc.nat(2), rseg: fc.nat(2), loff: fc.nat(4000), roff: fc.nat(4000), len: fc.integer({ min: 1, max: 300 }) })
    fc.assert(fc.property(fc.array(block, { minLength: 1, maxLength: 40 }), fc.integer({ min: 1, max: 256 }), fc.integer({ min: 1, max: 4 }), fc.boolean(), (blocks, maxSlice, qps, adjacent) => {
      // Half the runs use chains of neighbours, so coalescing has work to do.
      if (adjacent) for (let i = 1; i < blocks.length; i++) {
        const p = blocks[i - 1]!
        if (i % 3) blocks[i] = { ...blocks[i]!, lseg: p.lseg, rseg: p.rseg, loff: p.loff + p.len, roff: p.roff + p.len }
      }
      const cols = columns(blocks.map((b) => [b.lseg, b.loff, b.rseg, b.roff, b.len]))
      const bytes = validateColumns(cols, [9000, 9000, 9000], [9000, 9000, 9000])
      const plan = planSlices(cols, maxSlice, qps, bytes)
      expect(byteMap(plan.slices)).toEqual(byteMap(cols))
      for (const [, , , , len] of rows(plan.slices)) expect(len).toBeLessThanOrEqual(maxSlice)
      expect(plan.bounds[0]).toBe(0)
      expect(plan.bounds[qps]).toBe(plan.slices.count)
      for (let q = 0; q < qps; q++) expect(plan.bounds[q + 1]!).toBeGreaterThanOrEqual(plan.bounds[q]!)
      expect(plan.qps).toBeGreaterThanOrEqual(1)
      expect(plan.qps).toBeLessThanOrEqual(Math.min(qps, plan.slices.count))
    }), { numRuns: 100 })
  })
})
