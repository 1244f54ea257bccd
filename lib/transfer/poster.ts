// One poster per data QP (lane) of a peer. Transfers queue on it; it posts their
// slices in batches (one postBatch, one doorbell and one signaled completion
// per batch), taking turns between transfers (round robin: hundreds of
// concurrent transfers share the QP fairly), and never has more work
// requests in flight than the QP's send queue holds: the rest waits here,
// in JS, instead of failing with ENOMEM.
import type { CheckedPlan } from './plan.js'
import type { SegmentMemory } from './segments.js'
import type { NoticeTail } from './notices.js'

/**
 * Where a poster's batches go: a data QP (RDMA, qp-lane.ts) or a lane of a
 * TCP link (tcp/channel.ts). `post` moves slices from..to of the plan and
 * settles when the peer has them (RDMA: the batch's signaled completion;
 * TCP: the peer's ack); it rejects with a coded error.
 */
export interface Lane {
  /** The rail (device) the lane is on (rails.ts): 0 unless the agent has several. */
  readonly rail: number
  /** Work requests (slices) that may be in flight at once. */
  readonly depth: number
  /** Closed or in error: a failed batch broke the link (else it was refused alone). */
  readonly broken: boolean
  /** `tail`: the batch ends with a notice (RDMA only: the TCP link sends its notifications on its control channel). */
  post(plan: CheckedPlan, from: number, to: number, regions: readonly SegmentMemory[], tail?: NoticeTail): Promise<void>
  close(): void
}

/** A batch a source posted: its slices, the bytes they move, the send slots it takes, and its completion. */
export interface PostedBatch {
  wrs: number
  bytes: number
  /** Work requests: its slices, and its notice if it ends with one. */
  slots: number
  /** Its slices: from .. to of the plan. */
  from: number
  to: number
  /** The rail of the lane it was posted on, and the lane (QP) index. */
  rail: number
  q: number
  done: Promise<void>
}

/** A transfer's work for one QP. */
export interface PostSource {
  /** Settled (failed, timed out, aborted): post nothing more for it. */
  readonly settled: boolean
  /** Whether slices remain for QP `q`. */
  hasMore(q: number): boolean
  /**
   * Posts up to `max` of its work requests for QP `q` on `lane`, as one batch.
   * Throws, having posted nothing, when the batch cannot be posted (a segment
   * it names was unregistered meanwhile): that fails this transfer alone.
   */
  postNext(q: number, max: number, lane: Lane): PostedBatch
  batchDone(batch: PostedBatch): void
  /**
   * `linkBroken`: the QP is in the error state or closed (not a refusal of
   * this batch alone); `posted`: the batch was posted (else refused before),
   * `batch` then.
   */
  batchFailed(error: Error, linkBroken: boolean, posted: boolean, batch?: PostedBatch): void
}

export class QpPoster {
  readonly #queue: PostSource[] = []
  #inflight = 0
  /** Batches posted, and settled: a lane settles its batches in posting order (one RC send queue; one TCP stream). */
  #posted = 0
  #settled = 0
  #drains: Array<{ upTo: number; resolve: () => void }> = []
  readonly #depth: number
  readonly #batch: number

  constructor(readonly lane: Lane, readonly index: number, batchWrs: number) {
    this.#depth = lane.depth
    this.#batch = Math.max(1, Math.min(batchWrs, this.#depth))
  }

  /** Work requests posted and not completed. */
  get inflight(): number { return this.#inflight }
  /** Transfers waiting for their turn. */
  get waiting(): number { return this.#queue.length }

  add(source: PostSource): void {
    if (!source.hasMore(this.index)) return
    this.#queue.push(source)
    this.pump()
  }

  /** A source that may have new work for this lane (a rail failed: rails.ts), queued unless it is already. */
  wake(source: PostSource): void {
    if (this.#queue.includes(source)) return this.pump()
    this.add(source)
  }

  /**
   * Posts batches while the send queue has room; one batch per transfer per
   * turn. A batch may take one slot more than its slices (a notice): the
   * lane's depth leaves that room.
   */
  pump(): void {
    while (this.#queue.length > 0 && this.#inflight + this.#batch <= this.#depth) {
      const source = this.#queue.shift()!
      if (source.settled) continue
      let batch: PostedBatch
      try {
        batch = source.postNext(this.index, this.#batch, this.lane)
      } catch (error) {
        source.batchFailed(error as Error, this.#linkBroken(), false)
        continue
      }
      if (source.hasMore(this.index)) this.#queue.push(source)
      const { slots } = batch
      if (slots === 0) continue
      this.#inflight += slots
      this.#posted++
      batch.done.then(() => {
        this.#inflight -= slots
        this.#batchSettled()
        source.batchDone(batch)
        this.pump()
      }, (error: Error) => {
        this.#inflight -= slots
        this.#batchSettled()
        source.batchFailed(error, this.#linkBroken(), true, batch)
        this.pump()
      })
    }
  }

  /**
   * Resolves once every batch posted before now has settled (completed,
   * failed, or flushed with the link): after a peer's withdrawal, the device
   * is then done with every work request that could name the segment.
   */
  drained(): Promise<void> {
    if (this.#settled >= this.#posted) return Promise.resolve()
    return new Promise((resolve) => this.#drains.push({ upTo: this.#posted, resolve }))
  }

  #batchSettled(): void {
    this.#settled++
    while (this.#drains.length > 0 && this.#drains[0]!.upTo <= this.#settled) this.#drains.shift()!.resolve()
  }

  /** Whether the lane is closed or in the error state (else a failed batch was refused alone). */
  #linkBroken(): boolean {
    return this.lane.broken
  }

  /** Drops every queued transfer (the link failed; they were rejected). */
  clear(): void {
    this.#queue.length = 0
  }
}
