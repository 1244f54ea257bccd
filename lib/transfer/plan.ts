// From the caller's blocks to a checked plan: segments resolved and rights
// checked once per distinct segment, every block checked against both
// tables' bounds, then coalesced, sliced and striped (blocks.ts).
import { RdmaError } from '../core/errors.js'
import { typeError } from '../core/validate.js'
import { emptyColumns, planSlices, validateColumns, type BlockColumns, type SlicePlan } from './blocks.js'
import { Segment, type LocalTable, type RemoteSegment, type RemoteTable } from './segments.js'

/** A local segment: the Segment register() returned, or its name. */
export type LocalSegmentRef = Segment | string

/** One block: `length` bytes between [local segment, offset] here and [peer's segment name, offset] there. */
export interface Block {
  local: readonly [LocalSegmentRef, number]
  remote: readonly [string, number]
  length: number
}

/**
 * Many blocks of one size between two segments, as offsets in typed arrays:
 * block i is localOffsets[i] here and remoteOffsets[i] there. No object per
 * block, for thousands of blocks.
 */
export interface BlockArrays {
  local: LocalSegmentRef
  remote: string
  localOffsets: ArrayLike<number>
  remoteOffsets: ArrayLike<number>
  blockSize: number
}

export type Blocks = readonly Block[] | BlockArrays

export type TransferOp = 'read' | 'write'

/** A checked plan: the slices, and the segments they name (qp-lane.ts encodes the work requests from both at posting). */
export interface CheckedPlan extends SlicePlan {
  op: TransferOp
  locals: Segment[]
  remotes: RemoteSegment[]
}

/**
 * Block i's `side` pair, checked to be [segment, offset]. The errors of the
 * loop over the blocks are made in functions of their own (notBlock, notPair):
 * a template string in the loop made V8 box the block's numbers on every pass
 * (~24 B of heap per block, measured with bench/plan.mjs).
 */
function pair(value: unknown, i: number, side: 'local' | 'remote'): readonly [unknown, number] {
  if (!Array.isArray(value) || value.length !== 2) throw notPair(value, i, side)
  return value as unknown as readonly [unknown, number]
}

function notPair(value: unknown, i: number, side: 'local' | 'remote'): Error {
  return typeError('a [segment, offset] pair', `blocks[${i}].${side}`, value)
}

function notBlock(value: unknown, i: number): Error {
  return typeError('a block { local, remote, length }', `blocks[${i}]`, value)
}

/** Validates `blocks` for `op` against both tables and plans its slices. */
/** `weights`: each QP's share of the bytes (several rails: link.laneWeights()); undefined: equal. */
export function checkBlocks(op: TransferOp, blocks: Blocks, local: LocalTable, remote: RemoteTable, maxSliceBytes: number, qps: number, weights?: ArrayLike<number>): CheckedPlan {
  let cols: BlockColumns
  if (Array.isArray(blocks)) {
    const list = blocks as readonly Block[]
    if (list.length === 0) throw typeError('a non-empty list of blocks', 'blocks', blocks)
    cols = emptyColumns(list.length)
    // The columns in locals: each store then skips the plan object's field loads.
    const { lseg, rseg, loff, roff, len } = cols
    // Consecutive blocks usually name the same segments: resolve each change once.
    let lastLocal: unknown
    let lastLocalIndex = 0
    let lastRemote: unknown
    let lastRemoteIndex = 0
    for (let i = 0; i < list.length; i++) {
      const block = list[i]
      if (typeof block !== 'object' || block === null) throw notBlock(block, i)
      const lpair = pair(block.local, i, 'local')
      const rpair = pair(block.remote, i, 'remote')
      const lref = lpair[0]
      const lo = lpair[1]
      const rref = rpair[0]
      const ro = rpair[1]
      const length = block.length
      if (lref !== lastLocal) { lastLocalIndex = local.resolve(lref).index; lastLocal = lref }
      if (rref !== lastRemote) { lastRemoteIndex = remote.resolve(rref, op).index; lastRemote = rref }
      lseg[i] = lastLocalIndex
      rseg[i] = lastRemoteIndex
      loff[i] = typeof lo === 'number' ? lo : NaN
      roff[i] = typeof ro === 'number' ? ro : NaN
      len[i] = typeof length === 'number' ? length : NaN
    }
  } else if (typeof blocks === 'object' && blocks !== null) {
    const b = blocks as BlockArrays
    const count = b.localOffsets?.length
    if (typeof count !== 'number' || count === 0 || b.remoteOffsets?.length !== count) {
      throw typeError('localOffsets and remoteOffsets of the same, non-zero length', 'blocks', blocks)
    }
    const lseg = local.resolve(b.local).index
    const rseg = remote.resolve(b.remote, op).index
    cols = emptyColumns(count)
    cols.lseg.fill(lseg)
    cols.rseg.fill(rseg)
    cols.loff.set(b.localOffsets)
    cols.roff.set(b.remoteOffsets)
    cols.len.fill(typeof b.blockSize === 'number' ? b.blockSize : NaN)
  } else {
    throw typeError('a list of blocks or { local, remote, localOffsets, remoteOffsets, blockSize }', 'blocks', blocks)
  }
  const bytes = validateColumns(cols, local.lengths, remote.lengths)
  const plan = planSlices(cols, maxSliceBytes, qps, bytes, weights)
  // Every field named (no spread): a spread's copy took a map of its own per plan, so every load of a plan's
  // field on the hot path missed (megamorphic) and each added field made a new map (~30k instructions per write).
  return {
    slices: plan.slices, bounds: plan.bounds, bytes: plan.bytes, blocks: plan.blocks, qps: plan.qps, map: plan.map,
    op, locals: local.byIndex, remotes: remote.byIndex,
  }
}

/** The distinct segment indexes a plan's slices use, on each side (usually one each). */
export interface SegmentsUsed { locals: Set<number>; remotes: Set<number> }

/** Throws ERR_SEGMENT_WITHDRAWN if a segment the plan's slices name was unregistered since it was checked. */
export function assertCurrent(plan: CheckedPlan, used: SegmentsUsed): void {
  for (const i of used.locals) {
    const s = plan.locals[i]!
    if (s.withdrawn) throw new RdmaError(`Local segment '${s.name}' was unregistered`, { code: 'ERR_SEGMENT_WITHDRAWN' })
  }
  for (const i of used.remotes) {
    const s = plan.remotes[i]!
    if (s.withdrawn) throw new RdmaError(`The peer withdrew segment '${s.name}'`, { code: 'ERR_SEGMENT_WITHDRAWN' })
  }
}

/** Whether every segment the plan's slices name is still registered (on both sides): checked before each run() of a prepared plan. */
export function isCurrent(plan: CheckedPlan, used: SegmentsUsed): boolean {
  for (const i of used.locals) if (plan.locals[i]!.withdrawn) return false
  for (const i of used.remotes) if (plan.remotes[i]!.withdrawn) return false
  return true
}

/**
 * A plan checked anew by `check` (a new link, or a segment of `stale` was
 * withdrawn); on the same link, a segment withdrawn and not registered again
 * is ERR_SEGMENT_WITHDRAWN (as assertCurrent says), not ERR_SEGMENT_UNKNOWN.
 */
export function recheck(stale: CheckedPlan, used: SegmentsUsed, sameLink: boolean, check: () => CheckedPlan): CheckedPlan {
  try {
    return check()
  } catch (error) {
    if ((error as RdmaError).code === 'ERR_SEGMENT_UNKNOWN' && sameLink) assertCurrent(stale, used)
    throw error
  }
}

/**
 * The distinct segment indexes a plan's slices use. A Set is added to only
 * where the segment changes from the slice before (consecutive slices
 * usually share theirs): adding every slice's cost more than the rest of
 * planning a small plan, and a list searched on each change grows
 * quadratically with thousands of segments in one plan.
 */
export function segmentsUsed(plan: CheckedPlan): SegmentsUsed {
  const locals = new Set<number>()
  const remotes = new Set<number>()
  const { count, lseg, rseg } = plan.slices
  let l = -1
  let r = -1
  for (let i = 0; i < count; i++) {
    if (lseg[i] !== l) locals.add(l = lseg[i]!)
    if (rseg[i] !== r) remotes.add(r = rseg[i]!)
  }
  return { locals, remotes }
}
