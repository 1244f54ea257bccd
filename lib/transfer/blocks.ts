// Pure block arithmetic of the transfer engine (no device needed): blocks as
// columns of numbers, validated against both segment tables' bounds,
// coalesced where they touch on both sides, cut into slices no larger than
// one work request may carry, and split into one contiguous run per QP.
import { RdmaError } from '../core/errors.js'
import { rangeError } from '../core/validate.js'
import { blockMap, type BlockMap } from './landed.js'

/** Blocks in columns: block i moves len[i] bytes between (lseg[i], loff[i]) here and (rseg[i], roff[i]) there. */
export interface BlockColumns {
  count: number
  lseg: Uint32Array
  loff: Float64Array
  rseg: Uint32Array
  roff: Float64Array
  len: Float64Array
}

/**
 * Up to this many entries a column is a typed array of its own: V8 keeps
 * those (64 bytes at most) in its heap, cheap to make. Longer columns of one
 * plan share one buffer: up to SLAB_SHARE bytes a part of a slab, beyond it
 * an ArrayBuffer of their own.
 */
const OWN_ARRAYS_UP_TO = 8

/**
 * Columns of small plans (tens of blocks) are cut from 64 KiB slabs, in
 * turn, never reused: an ArrayBuffer of their own (off-heap memory, tracked
 * by the collector) cost more than the rest of planning (~450 ns of ~800 on
 * a host core for 16 blocks). A slab is freed with the last plan that uses
 * it (a kept plan holds at most 64 KiB).
 */
const SLAB_BYTES = 64 * 1024
const SLAB_SHARE = 4096
let slab = new ArrayBuffer(SLAB_BYTES)
let slabUsed = 0

/** Views of `count` blocks' columns on `b` from byte `o` (a multiple of 8): Float64 columns first, every view aligned. */
function columnsOn(b: ArrayBuffer, o: number, count: number): BlockColumns {
  return {
    count, loff: new Float64Array(b, o, count), roff: new Float64Array(b, o + 8 * count, count), len: new Float64Array(b, o + 16 * count, count),
    lseg: new Uint32Array(b, o + 24 * count, count), rseg: new Uint32Array(b, o + 28 * count, count),
  }
}

export function emptyColumns(count: number): BlockColumns {
  if (count <= OWN_ARRAYS_UP_TO) {
    // The fields in the order columnsOn() gives them: one object shape (map) for every plan, so loads of a column stay monomorphic.
    return { count, loff: new Float64Array(count), roff: new Float64Array(count), len: new Float64Array(count), lseg: new Uint32Array(count), rseg: new Uint32Array(count) }
  }
  const bytes = 32 * count // a multiple of 8: the next plan's columns on the slab are aligned too
  if (bytes > SLAB_SHARE) return columnsOn(new ArrayBuffer(bytes), 0, count)
  if (slabUsed + bytes > SLAB_BYTES) {
    slab = new ArrayBuffer(SLAB_BYTES)
    slabUsed = 0
  }
  const at = slabUsed
  slabUsed += bytes
  return columnsOn(slab, at, count)
}

function blockError(message: string): RdmaError {
  return new RdmaError(message, { code: 'ERR_BLOCK_RANGE' })
}

const isCount = (value: number): boolean => Number.isSafeInteger(value) && value >= 0

/**
 * Checks every block against the lengths of the segments it names on both
 * sides (`localLengths[lseg]`, `remoteLengths[rseg]`). Throws ERR_BLOCK_RANGE
 * naming the first bad block; returns the total bytes. The loop only finds
 * the first bad block: its message is made by badBlock(), because numbers
 * that a message in the loop could need are boxed on every pass (~24 B of
 * heap per block, measured with bench/plan.mjs).
 */
export function validateColumns(cols: BlockColumns, localLengths: ArrayLike<number>, remoteLengths: ArrayLike<number>): number {
  const { count, lseg, loff, rseg, roff, len } = cols
  let bytes = 0
  for (let i = 0; i < count; i++) {
    const n = len[i]!
    const lo = loff[i]!
    const ro = roff[i]!
    const localLength = localLengths[lseg[i]!]
    const remoteLength = remoteLengths[rseg[i]!]
    if (!(n >= 1) || !isCount(n) || !isCount(lo) || !isCount(ro) || localLength === undefined || remoteLength === undefined ||
      lo + n > localLength || ro + n > remoteLength) throw badBlock(cols, i, localLengths, remoteLengths)
    bytes += n
  }
  // Blocks may overlap (the same bytes sent twice): their sum can pass what a number counts exactly.
  if (bytes > Number.MAX_SAFE_INTEGER) throw blockError(`The blocks add up to ${bytes} bytes, more than one transfer counts exactly (2^53 - 1): split them into several transfers`)
  return bytes
}

/** The ERR_BLOCK_RANGE error of block i, which validateColumns() found bad. */
function badBlock(cols: BlockColumns, i: number, localLengths: ArrayLike<number>, remoteLengths: ArrayLike<number>): RdmaError {
  const len = cols.len[i]!
  const loff = cols.loff[i]!
  const roff = cols.roff[i]!
  if (!(len >= 1) || !isCount(len) || !isCount(loff) || !isCount(roff)) {
    return blockError(`Block ${i}: offsets must be integers >= 0 and the length an integer >= 1 (local ${loff}, remote ${roff}, length ${len})`)
  }
  const localLength = localLengths[cols.lseg[i]!]
  const remoteLength = remoteLengths[cols.rseg[i]!]
  if (localLength === undefined || remoteLength === undefined) return blockError(`Block ${i}: names a segment that is not in the table`)
  if (loff + len > localLength) return blockError(`Block ${i}: local bytes ${loff}..${loff + len} are outside the local segment (${localLength} bytes)`)
  return blockError(`Block ${i}: remote bytes ${roff}..${roff + len} are outside the remote segment (${remoteLength} bytes)`)
}

/** Whether block i comes before block j in (remote segment, remote offset) order. */
function remoteOrder(cols: BlockColumns, i: number, j: number): number {
  return cols.rseg[i]! - cols.rseg[j]! || cols.roff[i]! - cols.roff[j]!
}

/**
 * The blocks' indexes in remote order. Usually without a comparator: when
 * (remote position x count + index) fits a double exactly, the positions are
 * packed with their indexes into a Float64Array and sorted natively (a JS
 * comparator made sorting 4096 blocks cost tens to hundreds of ms).
 */
export function remoteOrderIndexes(cols: BlockColumns): Uint32Array {
  const n = cols.count
  const order = new Uint32Array(n)
  // Remote positions: segments laid end to end (segment r starts at base[r]).
  let segments = 0
  for (let i = 0; i < n; i++) if (cols.rseg[i]! + 1 > segments) segments = cols.rseg[i]! + 1
  const span = new Float64Array(segments)
  for (let i = 0; i < n; i++) {
    const end = cols.roff[i]! + 1
    if (end > span[cols.rseg[i]!]!) span[cols.rseg[i]!] = end
  }
  const base = new Float64Array(segments)
  let total = 0
  for (let r = 0; r < segments; r++) { base[r] = total; total += span[r]! }
  if (total * n < 2 ** 53) {
    const keys = new Float64Array(n)
    for (let i = 0; i < n; i++) keys[i] = (base[cols.rseg[i]!]! + cols.roff[i]!) * n + i
    keys.sort()
    for (let k = 0; k < n; k++) order[k] = keys[k]! % n
    return order
  }
  for (let i = 0; i < n; i++) order[i] = i
  return order.sort((a, b) => remoteOrder(cols, a, b))
}

/**
 * Merges blocks that continue each other on both sides (same segments, the
 * next block starts where the previous one ends, here and there). Blocks are
 * first put in remote order (skipped when they already are), so a shuffled
 * list of neighbours still merges. The bytes moved are the same.
 */
export function coalesce(cols: BlockColumns): BlockColumns {
  return coalesceRuns(cols).runs
}

/** Whether block j continues block i on both sides (same segments, j starts where i ends, here and there). */
function continues(a: BlockColumns, i: number, b: BlockColumns, j: number): boolean {
  return a.lseg[i] === b.lseg[j] && a.rseg[i] === b.rseg[j] && a.loff[i]! + a.len[i]! === b.loff[j] && a.roff[i]! + a.len[i]! === b.roff[j]
}

/**
 * coalesce(), with which blocks each run holds: run m is the blocks at order
 * positions starts[m] .. starts[m + 1]. Blocks already in order of which none
 * continues the last (one block, say) are their own runs: `cols` itself,
 * with no starts (run m is block m), and no column made.
 */
export function coalesceRuns(cols: BlockColumns): { runs: BlockColumns; order: Uint32Array | undefined; starts: Uint32Array | undefined } {
  const { count: n, lseg, loff, rseg, roff, len } = cols
  let sorted = true
  let touching = false
  // remoteOrder() and continues() of neighbours, on the columns in locals: this check is all a small plan in order pays.
  for (let i = 1; i < n; i++) {
    const r = rseg[i - 1]!
    const end = roff[i - 1]! + len[i - 1]!
    if (r > rseg[i]! || (r === rseg[i]! && roff[i - 1]! > roff[i]!)) { sorted = false; break }
    if (!touching && r === rseg[i] && end === roff[i] && lseg[i - 1] === lseg[i] && loff[i - 1]! + len[i - 1]! === loff[i]) touching = true
  }
  if (sorted && !touching) return { runs: cols, order: undefined, starts: undefined }
  const order = sorted ? undefined : remoteOrderIndexes(cols)
  const out = emptyColumns(n)
  const starts = new Uint32Array(n + 1)
  let m = -1
  for (let k = 0; k < n; k++) {
    const i = order ? order[k]! : k
    if (m >= 0 && continues(out, m, cols, i)) {
      out.len[m] = out.len[m]! + cols.len[i]!
      continue
    }
    m++
    starts[m] = k
    out.lseg[m] = cols.lseg[i]!
    out.loff[m] = cols.loff[i]!
    out.rseg[m] = cols.rseg[i]!
    out.roff[m] = cols.roff[i]!
    out.len[m] = cols.len[i]!
  }
  out.count = m + 1
  starts[m + 1] = n
  return { runs: out, order, starts: starts.subarray(0, m + 2) }
}

/** The most slices one plan holds: they are indexed with 32 bits (Uint32Array columns). */
export const MAX_SLICES = 2 ** 32 - 1

/** Cuts every block into slices of at most `maxBytes` (one work request each), in order. */
export function slice(cols: BlockColumns, maxBytes: number): BlockColumns {
  return sliceRuns(cols, maxBytes).slices
}

/** slice(), with the run (entry of `cols`) each slice was cut from; none when no run was cut (slice i is run i, `cols` itself). */
export function sliceRuns(cols: BlockColumns, maxBytes: number): { slices: BlockColumns; run: Uint32Array | undefined } {
  if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw rangeError('a slice size of at least 1 byte', 'sliceBytes', maxBytes)
  let total = 0
  for (let i = 0; i < cols.count; i++) total += Math.ceil(cols.len[i]! / maxBytes)
  if (total > MAX_SLICES) throw blockError(`The blocks make ${total} work requests of at most ${maxBytes} bytes, more than one transfer indexes (2^32 - 1): use larger slices or several transfers`)
  if (total === cols.count) return { slices: cols, run: undefined }
  const run = new Uint32Array(total)
  const out = emptyColumns(total)
  let m = 0
  for (let i = 0; i < cols.count; i++) {
    const len = cols.len[i]!
    for (let at = 0; at < len; at += maxBytes, m++) {
      run[m] = i
      out.lseg[m] = cols.lseg[i]!
      out.loff[m] = cols.loff[i]! + at
      out.rseg[m] = cols.rseg[i]!
      out.roff[m] = cols.roff[i]! + at
      out.len[m] = Math.min(maxBytes, len - at)
    }
  }
  return { slices: out, run }
}

/**
 * Splits slices into `qps` contiguous runs of about equal bytes (or, with
 * `weights`, of bytes in proportion to weights[q]; a weight of 0 gives an
 * empty run): run q is slices bounds[q] .. bounds[q + 1]. A run may be empty
 * (fewer slices than QPs). Run 0 holds the first slice whenever there is one
 * (a write's notification rides on the first QP used).
 */
export function stripe(cols: BlockColumns, qps: number, weights?: ArrayLike<number>): Uint32Array {
  const bounds = new Uint32Array(qps + 1)
  let total = 0
  for (let i = 0; i < cols.count; i++) total += cols.len[i]!
  // Run q - 1 ends at the cumulative weight `end` of runs 0 .. q - 1 (without weights: q, as (total * q) / qps always was).
  let acc = qps
  if (weights) {
    acc = 0
    for (let r = 0; r < qps; r++) acc += weights[r]!
  }
  let q = 1
  let end = weights ? weights[0]! : 1
  let sum = 0
  // Leading runs of weight 0 (a rail down) take nothing, not even the first slice.
  if (weights && acc > 0 && total > 0) while (q < qps && end === 0) { bounds[q++] = 0; end += weights[q - 1]! }
  for (let i = 0; i < cols.count && q < qps; i++) {
    sum += cols.len[i]!
    // Close run q-1 after the slice that takes it to its share of the bytes.
    while (q < qps && sum >= (total * end) / acc) { bounds[q++] = i + 1; end += weights ? weights[q - 1]! : 1 }
  }
  for (; q <= qps; q++) bounds[q] = cols.count
  return bounds
}

/** What a transfer posts: its slices, one run per QP, and its totals. */
export interface SlicePlan {
  slices: BlockColumns
  bounds: Uint32Array
  bytes: number
  blocks: number
  /** QPs with at least one slice. */
  qps: number
  /** From slices back to the caller's blocks (what landed.ts tallies). */
  map: BlockMap
}

/** Coalesces, slices and stripes validated blocks (in proportion to `weights` per QP, if given). */
export function planSlices(cols: BlockColumns, maxSliceBytes: number, qps: number, bytes: number, weights?: ArrayLike<number>): SlicePlan {
  const { runs, order, starts } = coalesceRuns(cols)
  const { slices, run } = sliceRuns(runs, maxSliceBytes)
  const bounds = stripe(slices, qps, weights)
  let used = 0
  for (let q = 0; q < qps; q++) if (bounds[q + 1]! > bounds[q]!) used++
  return { slices, bounds, bytes, blocks: cols.count, qps: used, map: blockMap(cols, order, starts, slices, run) }
}
