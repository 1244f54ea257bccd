// One run of a checked plan on a peer link: hands its slices to the link's
// QP posters, counts what completions confirm, and settles exactly once —
// done (after the notification, if any, is sent), or failed / stalled /
// timed out / aborted with the blocks known to have landed.
import { performance } from 'node:perf_hooks'
import { RdmaError } from '../core/errors.js'
import type { CheckedPlan } from './plan.js'
import type { Lane, PostedBatch, PostSource, QpPoster } from './poster.js'
import type { SegmentMemory } from './segments.js'
import type { RdmaErrorCode } from '../core/error-codes.js'
import { LandedBlocks } from './landed.js'
import { Resubmits } from './failover.js'
import { codeOf, TransferError, type LandedReport } from './transfer-error.js'
import type { OutgoingNotice } from './notice-sender.js'
import type { StallWatch, Watched } from './stall-watch.js'

/** What a successful transfer resolves with. */
export interface TransferResult {
  /** Bytes moved. */
  bytes: number
  /** Blocks as given (before coalescing). */
  blocks: number
  /** Work requests posted (slices after coalescing and slicing). */
  workRequests: number
  /** QPs used. */
  qps: number
  ms: number
}

export interface RunHooks {
  peer: string
  /** Sends the notification after the data (ordered per peer); resolves when the peer has it. */
  notify?: () => Promise<void>
  /** RDMA writes: the notification rides on each QP's last batch instead (notices.ts). */
  notice?: OutgoingNotice
  /** A batch failed and its QP is in the error state: the link is broken. */
  onBatchError(error: Error): void
  /** A batch of `bytes` completed on rail `rail` (rails.ts). */
  railDone(rail: number, bytes: number): void
  /** Several rails: at success, the bytes each rail moved and the ms from start to its last completion (the link's RailMeter). */
  measured: ((bytes: readonly number[], ms: readonly number[]) => void) | undefined
  /**
   * Several rails: a batch on rail `rail` failed with its QP in the error
   * state (the control channel's rail: always the link's failure). True: the rail is (now) down and the run's slices on it go
   * to the others (railDown()); false: the link is broken (onBatchError).
   */
  railFailed: ((rail: number, error: Error) => boolean) | undefined
  /** Slices of the run were put back to be posted again: the lanes still up take them (posters woken). */
  resubmit: ((run: TransferRun) => void) | undefined
  /** A notified write whose failed lanes owe their markers: posts `count` more markers of its notice after the data. */
  markers: ((count: number) => Promise<void>) | undefined
  settled(run: TransferRun, error: Error | undefined, result: TransferResult | undefined): void
}

/** Called with the bytes confirmed so far (completions) and the transfer's total, at most once per completed batch. */
export type TransferProgressListener = (bytesConfirmed: number, bytes: number) => void

/** The bounds of one run: none of them is required (the agent gives defaults). */
export interface RunBounds {
  /** Overall bound, from start. */
  timeoutMs: number | undefined
  /** Fails the run when no completion came for this long. */
  stallTimeoutMs: number | undefined
  signal: AbortSignal | undefined
  onProgress: TransferProgressListener | undefined
}

/** The rail tallies of a run that does not measure them (one rail): never written. */
const NO_RAILS: number[] = []

/** A failure that waits for the run's batches in flight to settle (so that their completions are counted). */
interface Pending { cause: unknown; why: string }

export class TransferRun implements PostSource, Watched {
  readonly #plan: CheckedPlan
  readonly #cursor: Uint32Array
  readonly #hooks: RunHooks
  readonly #started = performance.now()
  readonly #landed: LandedBlocks
  /** Bytes of completed slices (blocks partly landed included): what progress reports. */
  #confirmed = 0
  #slicesLeft: number
  /** This run's batches posted and not settled. */
  #inflight = 0
  #done = false
  #pending: Pending | undefined
  #timer: NodeJS.Timeout | undefined
  /** The stall bound (0: none); the link's StallWatch checks it against the last completion's time. */
  #stallMs = 0
  #lastProgress = this.#started
  #signal: AbortSignal | undefined
  #onProgress: TransferProgressListener | undefined
  /** Several rails (hooks.measured): bytes completed on each, and the time of its last completion; empty otherwise. */
  readonly #railBytes: number[]
  readonly #railLast: number[]
  /** Several rails: slices to post again after a rail failed (failover.ts). */
  readonly #redo: Resubmits | undefined
  /** The rail of the batch postNext() last refused (its slices go to #redo if that rail failed). */
  #refused: { from: number; to: number; rail: number } | undefined
  /** The signal's listener, made only for a run given a signal (most are not). */
  #onAbort: (() => void) | undefined

  constructor(plan: CheckedPlan, hooks: RunHooks) {
    this.#plan = plan
    this.#hooks = hooks
    this.#cursor = plan.bounds.slice(0, plan.bounds.length - 1)
    this.#slicesLeft = plan.slices.count
    this.#landed = new LandedBlocks(plan.map)
    if (hooks.railFailed) this.#redo = new Resubmits(plan.bounds.length - 1)
    this.#railBytes = hooks.measured ? [] : NO_RAILS
    this.#railLast = hooks.measured ? [] : NO_RAILS
  }

  /** Settled, or failing once its batches in flight settle: post nothing more for it. */
  get settled(): boolean { return this.#done || this.#pending !== undefined }

  /** Queues the run on the posters, bounded by `timeoutMs`, `stallTimeoutMs` (checked by the link's `stalls`) and `signal`. */
  start(posters: readonly QpPoster[], bounds: RunBounds, stalls: StallWatch): void {
    const { timeoutMs, stallTimeoutMs, signal } = bounds
    this.#onProgress = bounds.onProgress
    if (signal) {
      this.#signal = signal
      this.#onAbort = () => this.fail(this.#error('ABORT_ERR', `Transfer aborted after ${this.#landed.bytes} of ${this.#plan.bytes} bytes`, signal.reason))
      if (signal.aborted) return this.#onAbort()
      signal.addEventListener('abort', this.#onAbort, { once: true })
    }
    if (timeoutMs !== undefined) {
      this.#timer = setTimeout(() => this.fail(this.#error('ETIMEDOUT', `Transfer timed out after ${timeoutMs} ms with ${this.#landed.bytes} of ${this.#plan.bytes} bytes landed`)), timeoutMs)
    }
    if (stallTimeoutMs !== undefined) {
      // Progress costs a clock read per batch; the link's one timer does the rest.
      this.#stallMs = stallTimeoutMs
      stalls.started(this.#started + stallTimeoutMs)
    }
    for (const poster of posters) poster.add(this)
  }

  stallLeft(now: number): number {
    if (this.#done || this.#stallMs === 0) return Infinity
    const left = this.#lastProgress + this.#stallMs - now
    if (left > 0) return left
    // Waiting for batches after a failure that never settle: report that failure.
    if (this.#pending) this.#settle(this.#failure(this.#pending.cause, this.#pending.why), undefined)
    else this.fail(this.#error('ERR_STALLED', `Transfer stalled: no completion for ${this.#stallMs} ms, with ${this.#landed.bytes} of ${this.#plan.bytes} bytes landed`))
    return Infinity
  }

  #error(code: RdmaErrorCode, message: string, cause?: unknown): TransferError {
    return new TransferError(message, {
      code, ...this.#report(), bytes: this.#plan.bytes, peer: this.#hooks.peer, ...(cause !== undefined ? { cause } : {}),
    })
  }

  #report(): LandedReport {
    return { bytesLanded: this.#landed.bytes, blocksLanded: this.#landed.count, landedBlocks: this.#landed.bitmap }
  }

  hasMore(q: number): boolean {
    if (this.settled) return false
    const redo = this.#redo
    if (redo === undefined) return this.#cursor[q]! < this.#plan.bounds[q + 1]!
    return !redo.isDown(q) && (this.#cursor[q]! < this.#plan.bounds[q + 1]! || redo.pending)
  }

  /** Rail failover: lanes first..last-1 are on a rail that failed; what they had not posted goes to the others. */
  railDown(first: number, last: number): void {
    const redo = this.#redo
    if (redo === undefined || this.#done) return
    for (let q = first; q < last; q++) {
      redo.markDown(q)
      redo.put(this.#cursor[q]!, this.#plan.bounds[q + 1]!)
      this.#cursor[q] = this.#plan.bounds[q + 1]!
    }
  }

  postNext(q: number, max: number, lane: Lane): PostedBatch {
    const { slices, locals, remotes } = this.#plan
    let from = this.#cursor[q]!
    let to = Math.min(this.#plan.bounds[q + 1]!, from + max)
    const own = to > from
    if (this.#redo?.isDown(q)) to = from // its rail failed: nothing more on it
    else if (own) this.#cursor[q] = to
    else {
      const again = this.#redo?.take(max)
      if (again) ({ from, to } = again)
    }
    if (to <= from) return { wrs: 0, bytes: 0, slots: 0, from, to: from, rail: lane.rail, q, done: Promise.resolve() }
    // The local regions the batch names (held until it completes); a segment
    // unregistered since the plan was checked refuses the batch, before any
    // of it is posted.
    const regions: SegmentMemory[] = []
    let lastLocal = -1
    let lastRemote = -1
    let bytes = 0
    for (let i = from; i < to; i++) {
      bytes += slices.len[i]!
      const l = slices.lseg[i]!
      if (l !== lastLocal) {
        lastLocal = l
        const segment = locals[l]!
        if (segment.withdrawn) throw new RdmaError(`Local segment '${segment.name}' was unregistered during the transfer`, { code: 'ERR_SEGMENT_WITHDRAWN' })
        const region = segment.regionOn(lane.rail)
        if (!regions.includes(region)) regions.push(region)
      }
      const r = slices.rseg[i]!
      if (r !== lastRemote) {
        lastRemote = r
        const segment = remotes[r]!
        if (segment.withdrawn) throw new RdmaError(`The peer withdrew segment '${segment.name}' during the transfer`, { code: 'ERR_SEGMENT_WITHDRAWN' })
      }
    }
    const notice = this.#hooks.notice
    const tail = notice !== undefined && own && to === this.#plan.bounds[q + 1]! ? notice.tailFor(q) : undefined
    let done: Promise<void>
    try {
      done = lane.post(this.#plan, from, to, regions, tail)
    } catch (error) {
      this.#refused = { from, to, rail: lane.rail }
      throw error
    }
    if (tail?.slot) done.then(() => notice!.release(), () => notice!.release())
    this.#inflight++
    return { wrs: to - from, bytes, slots: tail ? to - from + 1 : to - from, from, to, rail: lane.rail, q, done }
  }

  batchDone(batch: PostedBatch): void {
    if (this.#done) return
    this.#inflight--
    this.#landed.add(this.#plan.slices, batch.from, batch.to)
    this.#confirmed += batch.bytes
    this.#slicesLeft -= batch.wrs
    this.#lastProgress = performance.now()
    this.#hooks.railDone(batch.rail, batch.bytes)
    if (batch.slots > batch.wrs) this.#redo?.tailed(batch.q)
    if (this.#hooks.measured) {
      this.#railBytes[batch.rail] = (this.#railBytes[batch.rail] ?? 0) + batch.bytes
      this.#railLast[batch.rail] = this.#lastProgress
    }
    if (this.#onProgress) {
      try {
        this.#onProgress(this.#confirmed, this.#plan.bytes)
      } catch (error) {
        return this.fail(this.#failure(error, 'its onProgress callback threw'))
      }
    }
    if (this.#pending) return this.#drained()
    if (this.#slicesLeft > 0) return
    // A notified write that lost a rail: the markers its failed lanes owe go now, after all the data.
    const owed = this.#hooks.notice && this.#redo?.anyDown ? this.#redo.owedMarkers(this.#plan.bounds) : 0
    if (owed > 0 && this.#hooks.markers) {
      this.#hooks.markers(owed).then(() => this.#finish(), (error: unknown) => this.fail(this.#failure(error, 'the notification could not be completed after a rail failed')))
      return
    }
    this.#finish()
  }

  /** Every slice is confirmed: the notification (a read's), then success. */
  #finish(): void {
    const notify = this.#hooks.notify
    if (!notify) return this.#succeed()
    notify().then(() => this.#succeed(), (error: unknown) => this.fail(this.#failure(error, 'the notification could not be sent')))
  }

  batchFailed(error: Error, linkBroken: boolean, posted: boolean, batch?: PostedBatch): void {
    if (this.#done) return
    const refused = this.#refused
    this.#refused = undefined
    const failed = posted ? batch : refused
    // Another rail than the control channel's failed: its slices go to the rails still up (the run goes on).
    if (linkBroken && failed && this.#hooks.railFailed?.(failed.rail, error)) {
      if (posted) this.#inflight--
      this.#redo!.put(failed.from, failed.to)
      this.#hooks.resubmit?.(this)
      if (this.#pending) this.#drained()
      return
    }
    if (posted) this.#inflight--
    this.#pending ??= { cause: error, why: linkBroken ? 'a work request failed' : 'a batch was refused' }
    if (linkBroken) this.#hooks.onBatchError(error)
    this.#drained()
  }

  /**
   * The link failed (`cause`): the run fails once its batches in flight have
   * settled (closing the QPs delivers the completions already in the CQ, and
   * they count as landed), or at once when none is in flight.
   */
  linkFailed(cause: unknown, why: string): void {
    if (this.#done) return
    this.#pending ??= { cause, why }
    this.#drained()
  }

  /** Settles a pending failure when nothing of the run is in flight. */
  #drained(): void {
    if (this.#pending && this.#inflight === 0) this.#settle(this.#failure(this.#pending.cause, this.#pending.why), undefined)
  }

  /** Rejects with `error` now (abort, timeout, stall), unless settled already. */
  fail(error: Error): void {
    this.#settle(error, undefined)
  }

  /** A TransferError for a failure caused by `cause`. */
  failure(cause: unknown, why: string): TransferError {
    return this.#failure(cause, why)
  }

  #failure(cause: unknown, why: string): TransferError {
    const status = (cause as { status?: string })?.status
    return new TransferError(`Transfer failed (${why}: ${(cause as Error)?.message ?? cause}) with ${this.#landed.bytes} of ${this.#plan.bytes} bytes landed`, {
      code: codeOf(cause), ...this.#report(), bytes: this.#plan.bytes, peer: this.#hooks.peer, cause, ...(status ? { status } : {}),
    })
  }

  #succeed(): void {
    const p = this.#plan
    if (this.#hooks.measured) {
      const ms: number[] = []
      for (let r = 0; r < this.#railBytes.length; r++) ms[r] = (this.#railLast[r] ?? this.#started) - this.#started
      this.#hooks.measured(this.#railBytes.map((b) => b ?? 0), ms)
    }
    this.#settle(undefined, { bytes: p.bytes, blocks: p.blocks, workRequests: p.slices.count, qps: p.qps, ms: performance.now() - this.#started })
  }

  #settle(error: Error | undefined, result: TransferResult | undefined): void {
    if (this.#done) return
    this.#done = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    if (this.#onAbort) this.#signal!.removeEventListener('abort', this.#onAbort)
    this.#hooks.settled(this, error, result)
  }
}
