// Resuming a failed transfer: the blocks of the caller's call whose bit in
// the TransferError's landed bitmap is clear are sent again, after the link
// is re-established as any transfer re-establishes it. The error keeps a
// reference to the caller's blocks (never a copy); the rest is a filtered
// list of references or new offset columns, with the map back to the
// original indexes, so a resume that fails again reports over those indexes.
import { performance } from 'node:perf_hooks'
import { RdmaError } from '../core/errors.js'
import { oneOf, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { progressOptions } from './agent-settings.js'
import type { NotificationMessage, TransferOptions } from './agent-options.js'
import { noticePayload } from './notifications.js'
import type { Peer } from './peer.js'
import type { Block, BlockArrays, Blocks, TransferOp } from './plan.js'
import type { TransferResult } from './run.js'
import { codeOf, TransferError, type LandedReport } from './transfer-error.js'

/** What a resume does when the peer answering now is another incarnation (a restarted process) than the one that failed. */
export type ResumeOnRestart = 'resend' | 'keep' | 'fail'

export interface ResumeOptions extends TransferOptions {
  /**
   * The peer restarted since the failure (a new incarnation answers):
   * `'resend'` (default) sends every block again (a new process has new
   * memory: what landed in the old one is gone); `'keep'` sends only the
   * blocks that did not land (the peer keeps its segments' contents across
   * restarts, e.g. memory it registers again); `'fail'` rejects with
   * ERR_PEER_RESTARTED, sending nothing.
   */
  onRestart?: ResumeOnRestart
}

/** A resume that completed: `bytes`, `blocks` and `workRequests` are what this resume sent. */
export interface ResumeResult extends TransferResult {
  /** Blocks of the original call not sent again (they had landed). */
  blocksSkipped: number
  bytesSkipped: number
  /** The peer was another incarnation than the one the failure was about. */
  restarted: boolean
}

/** What the agent lends a resume: its transfer, with the blocks chosen once the link is there (none: nothing posted). */
export type TransferWith = (op: TransferOp, peer: Peer, select: (peerAgent: string) => Blocks | undefined, options: TransferOptions) => Promise<TransferResult | undefined>

/** The agent, as a resume sees it. */
interface Agent { notify(peer: Peer, message: NotificationMessage, options?: WaitOptions): Promise<void> }

/** What a failed transfer needs to be resumed, kept beside its TransferError (no writable field on it). */
interface Resumable { agent: Agent; peer: Peer; op: TransferOp; blocks: Blocks }
const resumables = new WeakMap<TransferError, Resumable>()

/** The TransferError of a failed write(), read() or plan.run() of `blocks` becomes resumable by `agent` (launch.ts, as it rejects). */
export function markResumable(error: TransferError, agent: Agent, peer: Peer, op: TransferOp, blocks: Blocks): void {
  resumables.set(error, { agent, peer, op, blocks })
}

const isLanded = (bitmap: Uint8Array, i: number): boolean => ((bitmap[i >> 3] ?? 0) >> (i & 7) & 1) === 1
const countOf = (blocks: Blocks): number => Array.isArray(blocks) ? blocks.length : (blocks as BlockArrays).localOffsets.length
const lengthOf = (blocks: Blocks, i: number): number => Array.isArray(blocks) ? (blocks as readonly Block[])[i]!.length : (blocks as BlockArrays).blockSize

/** The blocks whose bit is clear, and their original indexes (undefined: all of them, as given). */
export function rest(blocks: Blocks, landed: Uint8Array): { blocks: Blocks; index: Uint32Array | undefined; count: number } {
  const n = countOf(blocks)
  let count = 0
  for (let i = 0; i < n; i++) if (!isLanded(landed, i)) count++
  if (count === n) return { blocks, index: undefined, count }
  const index = new Uint32Array(count)
  for (let i = 0, k = 0; i < n; i++) if (!isLanded(landed, i)) index[k++] = i
  if (Array.isArray(blocks)) return { blocks: Array.from(index, (i) => (blocks as readonly Block[])[i]!), index, count }
  const b = blocks as BlockArrays
  const localOffsets = new Float64Array(count)
  const remoteOffsets = new Float64Array(count)
  for (let k = 0; k < count; k++) { localOffsets[k] = b.localOffsets[index[k]!]!; remoteOffsets[k] = b.remoteOffsets[index[k]!]! }
  return { blocks: { local: b.local, remote: b.remote, localOffsets, remoteOffsets, blockSize: b.blockSize }, index, count }
}

/** The landed report over the original blocks: `base` and the bits `part` sets over the rest (through `index`). */
export function merged(blocks: Blocks, base: Uint8Array, part: Uint8Array | undefined, index: Uint32Array | undefined): LandedReport {
  const n = countOf(blocks)
  const landedBlocks = base.slice()
  if (part) {
    const m = index ? index.length : n
    for (let k = 0; k < m; k++) {
      if (!isLanded(part, k)) continue
      const i = index ? index[k]! : k
      landedBlocks[i >> 3] = landedBlocks[i >> 3]! | (1 << (i & 7))
    }
  }
  let blocksLanded = 0
  let bytesLanded = 0
  for (let i = 0; i < n; i++) if (isLanded(landedBlocks, i)) { blocksLanded++; bytesLanded += lengthOf(blocks, i) }
  return { landedBlocks, blocksLanded, bytesLanded }
}

/** Codes of errors before posting that a resume does not turn into a resumable failure: calling again would fail the same way. */
const FINAL = new Set(['ERR_CLOSED', 'ERR_PEER_RESTARTED', 'ERR_INVALID_ARG_TYPE', 'ERR_INVALID_ARG_VALUE', 'ERR_OUT_OF_RANGE'])

/** agent.resume(): sends the blocks of `failed` that did not land; see ResumeOptions for a restarted peer. */
export async function resume(agent: Agent, failed: unknown, options: ResumeOptions, transfer: TransferWith): Promise<ResumeResult> {
  if (!(failed instanceof TransferError)) throw typeError('the TransferError of a failed write(), read() or plan.run()', 'failed', failed)
  const state = resumables.get(failed)
  if (!state || state.agent !== agent) {
    throw Object.assign(new TypeError('Expected a TransferError of a write(), read() or plan.run() of this agent for failed (this one was not raised by this agent\'s transfers)'), { code: 'ERR_INVALID_ARG_VALUE' })
  }
  const o = optionalObject(options, 'options')
  const onRestart = oneOf(o.onRestart, 'options.onRestart', ['resend', 'keep', 'fail'] as const, 'resend')
  waitOptions(o)
  progressOptions(o, 1)
  if (o.notify !== undefined) noticePayload(o.notify)
  const { peer, op, blocks } = state
  if (peer.state === 'closed') throw new RdmaError(`The peer ${peer.name} was closed (closePeer): nothing to resume on`, { code: 'ERR_CLOSED' })
  const n = countOf(blocks)
  let chosen: { base: Uint8Array; index: Uint32Array | undefined; count: number; restarted: boolean; incarnation: string } | undefined
  const select = (peerAgent: string): Blocks | undefined => {
    const restarted = peerAgent !== failed.peer
    if (restarted && onRestart === 'fail') {
      throw new RdmaError(`Peer ${peer.name} restarted since the transfer failed (incarnation ${failed.peer} then, ${peerAgent} now): nothing resent (options.onRestart 'fail')`, { code: 'ERR_PEER_RESTARTED' })
    }
    const base = restarted && onRestart === 'resend' ? new Uint8Array(failed.landedBlocks.length) : failed.landedBlocks
    const r = rest(blocks, base)
    chosen = { base, index: r.index, count: r.count, restarted, incarnation: peerAgent }
    return r.count === 0 ? undefined : r.blocks
  }
  const started = performance.now()
  let result: TransferResult | undefined
  try {
    result = await transfer(op, peer, select, o as TransferOptions)
  } catch (error) {
    if (!(error instanceof TransferError) && FINAL.has(codeOf(error))) throw error
    // A failure before anything was chosen (reconnecting) leaves the report as it was; after, it covers both attempts.
    const report = chosen ? merged(blocks, chosen.base, error instanceof TransferError ? error.landedBlocks : undefined, chosen.index)
      : { bytesLanded: failed.bytesLanded, blocksLanded: failed.blocksLanded, landedBlocks: failed.landedBlocks.slice() }
    const cause = error as RdmaError
    const again = new TransferError(`Resume failed (${cause.message}); ${report.bytesLanded} of ${failed.bytes} bytes of the original transfer landed`, {
      code: codeOf(error), landedBlocks: report.landedBlocks, blocksLanded: report.blocksLanded, bytesLanded: report.bytesLanded,
      bytes: failed.bytes, peer: chosen?.incarnation ?? failed.peer, cause: error, ...(typeof cause.status === 'string' ? { status: cause.status } : {}),
    })
    resumables.set(again, state)
    throw again
  }
  const c = chosen!
  // Every block had landed: only the notification, if any, is left to send.
  if (!result && o.notify !== undefined) await agent.notify(peer, o.notify as NotificationMessage, { ...(o.timeoutMs !== undefined ? { timeoutMs: o.timeoutMs as number } : {}), ...(o.signal ? { signal: o.signal as AbortSignal } : {}) })
  const sent = result ?? { bytes: 0, blocks: 0, workRequests: 0, qps: 0, ms: performance.now() - started }
  return { ...sent, blocksSkipped: n - c.count, bytesSkipped: failed.bytes - sent.bytes, restarted: c.restarted }
}
