// Which of the caller's blocks landed, from which slices completed. Blocks
// are coalesced (several blocks in one run) and sliced (one block in several
// work requests, maybe on two QPs), so a slice's bytes are credited to the
// blocks it overlaps; a block has landed when all its bytes are credited.
// Columns only (no object per block or slice): planning 10^6 blocks stays flat.
import type { BlockColumns } from './blocks.js'

/**
 * From slices to the caller's blocks, computed once per plan. `starts`,
 * `run` and `first` are all undefined when slice i is block i (in order,
 * none merged, none cut: one block, say): no column is made for it.
 */
export interface BlockMap {
  /** The caller's blocks (their remote offsets and lengths are what is matched). */
  blocks: BlockColumns
  /** Blocks in the order coalescing took them (undefined: as given). */
  order: Uint32Array | undefined
  /** Coalesced run m holds the blocks at order positions starts[m] .. starts[m + 1]. */
  starts: Uint32Array | undefined
  /** The coalesced run slice i was cut from. */
  run: Uint32Array | undefined
  /** The order position of the first block slice i overlaps. */
  first: Uint32Array | undefined
}

function identity(n: number): Uint32Array {
  const a = new Uint32Array(n)
  for (let i = 0; i < n; i++) a[i] = i
  return a
}

/**
 * Maps every slice to the first block it overlaps (one pass: slices and blocks are both in run order).
 * `starts` undefined: run m is block m; `run` undefined: slice i is run i.
 */
export function blockMap(blocks: BlockColumns, order: Uint32Array | undefined, starts: Uint32Array | undefined, slices: BlockColumns, run: Uint32Array | undefined): BlockMap {
  if (order === undefined && starts === undefined && run === undefined) return { blocks, order, starts, run, first: undefined }
  starts ??= identity(blocks.count + 1)
  run ??= identity(slices.count)
  const first = new Uint32Array(slices.count)
  let k = 0
  let lastRun = -1
  for (let i = 0; i < slices.count; i++) {
    const m = run[i]!
    if (m !== lastRun) { k = starts[m]!; lastRun = m }
    const start = slices.roff[i]!
    // Blocks of one run follow each other on the remote side: skip those that end before this slice.
    for (;;) {
      const b = order ? order[k]! : k
      if (k + 1 >= starts[m + 1]! || blocks.roff[b]! + blocks.len[b]! > start) break
      k++
    }
    first[i] = k
  }
  return { blocks, order, starts, run, first }
}

/** One run's tally: bytes still missing per block, and the landed ones as a bitmap. */
export class LandedBlocks {
  readonly #map: BlockMap
  /** Undefined when slice i is block i: a completed slice is a landed block. */
  readonly #missing: Float64Array | undefined
  /** Bit i (byte i >> 3, bit i & 7) set: block i landed. */
  readonly bitmap: Uint8Array
  count = 0
  bytes = 0

  constructor(map: BlockMap) {
    this.#map = map
    this.#missing = map.first === undefined ? undefined : map.blocks.len.slice(0, map.blocks.count)
    this.bitmap = new Uint8Array(Math.ceil(map.blocks.count / 8))
  }

  /** Credits slices from .. to (completed) to their blocks. */
  add(slices: BlockColumns, from: number, to: number): void {
    const { blocks, order, starts, run, first } = this.#map
    const missing = this.#missing
    if (missing === undefined || first === undefined || starts === undefined || run === undefined) return this.#landed(from, to)
    for (let i = from; i < to; i++) {
      const start = slices.roff[i]!
      const end = start + slices.len[i]!
      const last = starts[run[i]! + 1]!
      for (let k = first[i]!; k < last; k++) {
        const b = order ? order[k]! : k
        const bStart = blocks.roff[b]!
        if (bStart >= end) break
        const overlap = Math.min(end, bStart + blocks.len[b]!) - Math.max(start, bStart)
        if (overlap <= 0) continue
        const left = missing[b]! - overlap
        missing[b] = left
        if (left === 0) this.#land(b)
      }
    }
  }

  /** Blocks from .. to landed (each was one slice). */
  #landed(from: number, to: number): void {
    for (let b = from; b < to; b++) this.#land(b)
  }

  #land(b: number): void {
    this.bitmap[b >> 3] = this.bitmap[b >> 3]! | (1 << (b & 7))
    this.count++
    this.bytes += this.#map.blocks.len[b]!
  }
}
