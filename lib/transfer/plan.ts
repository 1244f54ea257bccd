// From the caller's blocks to a checked plan: segments resolved and rights
// checked once per distinct segment, every block checked against both
// tables' bounds, then coalesced, sliced and striped (blocks.ts).
import { RdmaError } from '../errors.js'
import { typeError } from '../validate.js'
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

/** A checked plan: the slices and the segments they name. */
export interface CheckedPlan extends SlicePlan {
  op: TransferOp
  locals: Segment[]
  remotes: RemoteSegment[]
}

function pair(value: unknown, name: string): readonly [unknown, number] {
  if (!Array.isArray(value) || value.length !== 2) throw typeError('a [segment, offset] pair', name, value)
  return value as unknown as readonly [unknown, number]
}

/** Validates `blocks` for `op` against both tables and plans its slices. */
export function checkBlocks(op: TransferOp, blocks: Blocks, local: LocalTable, remote: RemoteTable, maxSliceBytes: number, qps: number): CheckedPlan {
  let cols: BlockColumns
  if (Array.isArray(blocks)) {
    const list = blocks as readonly Block[]
    if (list.length === 0) throw typeError('a non-empty list of blocks', 'blocks', blocks)
    cols = emptyColumns(list.length)
    // Consecutive blocks usually name the same segments: resolve each change once.
    let lastLocal: unknown
    let lastLocalIndex = 0
    let lastRemote: unknown
    let lastRemoteIndex = 0
    for (let i = 0; i < list.length; i++) {
      const block = list[i]
      if (typeof block !== 'object' || block === null) throw typeError('a block { local, remote, length }', `blocks[${i}]`, block)
      const [lref, loff] = pair(block.local, `blocks[${i}].local`)
      const [rref, roff] = pair(block.remote, `blocks[${i}].remote`)
      if (lref !== lastLocal) { lastLocalIndex = local.resolve(lref).index; lastLocal = lref }
      if (rref !== lastRemote) { lastRemoteIndex = remote.resolve(rref, op).index; lastRemote = rref }
      cols.lseg[i] = lastLocalIndex
      cols.rseg[i] = lastRemoteIndex
      cols.loff[i] = typeof loff === 'number' ? loff : NaN
      cols.roff[i] = typeof roff === 'number' ? roff : NaN
      cols.len[i] = typeof block.length === 'number' ? block.length : NaN
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
  const plan = planSlices(cols, maxSliceBytes, qps, bytes)
  return { ...plan, op, locals: local.byIndex, remotes: remote.byIndex }
}

/** Throws ERR_SEGMENT_WITHDRAWN if a segment the plan's slices name was unregistered since it was checked. */
export function assertCurrent(plan: CheckedPlan, used: { locals: Set<number>; remotes: Set<number> }): void {
  for (const i of used.locals) {
    const s = plan.locals[i]!
    if (s.withdrawn) throw new RdmaError(`Local segment '${s.name}' was unregistered`, { code: 'ERR_SEGMENT_WITHDRAWN' })
  }
  for (const i of used.remotes) {
    const s = plan.remotes[i]!
    if (s.withdrawn) throw new RdmaError(`The peer withdrew segment '${s.name}'`, { code: 'ERR_SEGMENT_WITHDRAWN' })
  }
}

/** The distinct segment indexes a plan's slices use. */
export function segmentsUsed(plan: CheckedPlan): { locals: Set<number>; remotes: Set<number> } {
  const locals = new Set<number>()
  const remotes = new Set<number>()
  const s = plan.slices
  for (let i = 0; i < s.count; i++) { locals.add(s.lseg[i]!); remotes.add(s.rseg[i]!) }
  return { locals, remotes }
}
