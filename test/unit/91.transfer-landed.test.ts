// From completed slices back to the caller's blocks (lib/transfer/landed.ts):
// blocks are coalesced, sliced and striped, then any set of slices completes;
// a block is reported landed exactly when every byte of it was in a completed
// slice, and the reported bytes are those blocks' lengths. Property-based,
// against a byte-level model.
import { describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { emptyColumns, planSlices, validateColumns } from '../../lib/transfer/blocks.js'
import { LandedBlocks } from '../../lib/transfer/landed.js'

/** Blocks over one remote segment without overlap (shuffled pieces of it), local offsets as given. */
const layouts = fc.record({
  lengths: fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 40 }),
  shuffle: fc.array(fc.nat(), { minLength: 40, maxLength: 40 }),
  localShuffle: fc.boolean(),
  gapEvery: fc.integer({ min: 0, max: 5 }),
  slice: fc.integer({ min: 1, max: 64 }),
  qps: fc.integer({ min: 1, max: 4 }),
  done: fc.array(fc.boolean(), { minLength: 64, maxLength: 64 }),
})

describe('landed blocks', () => {
  it('a block is landed exactly when all its bytes were in completed slices; bytes are the landed blocks\' lengths', () => {
    fc.assert(fc.property(layouts, ({ lengths, shuffle, localShuffle, gapEvery, slice, qps, done }) => {
      const n = lengths.length
      // Remote: pieces laid end to end (a gap now and then), then the block order shuffled.
      const remoteStart: number[] = []
      let at = 0
      lengths.forEach((len, i) => { remoteStart.push(at); at += len + (gapEvery > 0 && i % gapEvery === 0 ? 1 : 0) })
      const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => shuffle[a]! - shuffle[b]! || a - b)
      const cols = emptyColumns(n)
      let localAt = 0
      order.forEach((piece, i) => {
        cols.lseg[i] = 0
        cols.rseg[i] = 0
        cols.roff[i] = remoteStart[piece]!
        cols.len[i] = lengths[piece]!
        cols.loff[i] = localShuffle ? localAt : remoteStart[piece]!
        localAt += lengths[piece]!
      })
      const bytes = validateColumns(cols, [1 << 20], [1 << 20])
      const plan = planSlices(cols, slice, qps, bytes)
      // Any subset of slices completes, in batches by QP run (as posters do).
      const completed = new Uint8Array(plan.slices.count)
      const tally = new LandedBlocks(plan.map)
      for (let i = 0; i < plan.slices.count; i++) {
        if (!done[i % done.length]) continue
        completed[i] = 1
        tally.add(plan.slices, i, i + 1)
      }
      // The model: remote bytes covered by completed slices.
      const covered = new Uint8Array(at)
      for (let i = 0; i < plan.slices.count; i++) if (completed[i]) covered.fill(1, plan.slices.roff[i]!, plan.slices.roff[i]! + plan.slices.len[i]!)
      let count = 0
      let landedBytes = 0
      for (let b = 0; b < n; b++) {
        const whole = covered.subarray(cols.roff[b]!, cols.roff[b]! + cols.len[b]!).every((x) => x === 1)
        expect(((tally.bitmap[b >> 3]! >> (b & 7)) & 1) === 1, `block ${b}`).toBe(whole)
        if (whole) { count++; landedBytes += cols.len[b]! }
      }
      expect(tally.count).toBe(count)
      expect(tally.bytes).toBe(landedBytes)
      expect(tally.bitmap.length).toBe(Math.ceil(n / 8))
    }), { numRuns: 500 })
  })

  it('every slice completed: every block landed, at offsets past 2^32', () => {
    const n = 1000
    const cols = emptyColumns(n)
    const base = 2 ** 32 - 3000
    for (let i = 0; i < n; i++) {
      const j = (i * 7) % n // shuffled on the remote side, contiguous locally: nothing coalesces
      cols.roff[i] = base + j * 4096
      cols.loff[i] = base + i * 4096
      cols.len[i] = 4096
    }
    const plan = planSlices(cols, 1000, 3, n * 4096)
    const tally = new LandedBlocks(plan.map)
    for (let q = 0; q < 3; q++) tally.add(plan.slices, plan.bounds[q]!, plan.bounds[q + 1]!)
    expect(tally.count).toBe(n)
    expect(tally.bytes).toBe(n * 4096)
    expect(tally.bitmap.every((byte) => byte === 0xff)).toBe(true)
  })

  it('blocks in remote order, none continuing the last and none cut (one block, say): the plan is the blocks themselves, with no mapping columns, and each completed slice lands its block', () => {
    const cols = emptyColumns(3)
    const rows = [[0, 0, 100], [300, 4096, 200], [100, 8192, 50]] // loff, roff, len: gaps on the remote side
    rows.forEach(([loff, roff, len], i) => { cols.loff[i] = loff!; cols.roff[i] = roff!; cols.len[i] = len! })
    const plan = planSlices(cols, 4096, 2, 350)
    expect(plan.slices).toBe(cols)
    expect({ order: plan.map.order, starts: plan.map.starts, run: plan.map.run, first: plan.map.first }).toEqual({ order: undefined, starts: undefined, run: undefined, first: undefined })
    const tally = new LandedBlocks(plan.map)
    tally.add(plan.slices, 1, 3)
    expect({ bitmap: [...tally.bitmap], count: tally.count, bytes: tally.bytes }).toEqual({ bitmap: [0b110], count: 2, bytes: 250 })
    tally.add(plan.slices, 0, 1)
    expect({ bitmap: [...tally.bitmap], count: tally.count, bytes: tally.bytes }).toEqual({ bitmap: [0b111], count: 3, bytes: 350 })
  })
})
