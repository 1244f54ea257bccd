// One poster per data QP of a peer. Transfers queue on it; it posts their
// slices in batches (one postBatch, one doorbell and one signaled completion
// per batch), taking turns between transfers (round robin: hundreds of
// concurrent transfers share the QP fairly), and never has more work
// requests in flight than the QP's send queue holds: the rest waits here,
// in JS, instead of failing with ENOMEM.
import type { QueuePair } from '../verbs/queue-pair.js'

/** A batch a source posted: its work requests, the bytes they move, and its completion. */
export interface PostedBatch { wrs: number; bytes: number; /** Its slices: from .. to of the plan. */ from: number; to: number; done: Promise<void> }

/** A transfer's work for one QP. */
export interface PostSource {
  /** Settled (failed, timed out, aborted): post nothing more for it. */
  readonly settled: boolean
  /** Whether slices remain for QP `q`. */
  hasMore(q: number): boolean
  /**
   * Posts up to `max` of its work requests for QP `q` on `qp`, as one batch.
   * Throws, having posted nothing, when the batch cannot be posted (a segment
   * it names was unregistered meanwhile): that fails this transfer alone.
   */
  postNext(q: number, max: number, qp: QueuePair): PostedBatch
  batchDone(batch: PostedBatch): void
  /**
   * `linkBroken`: the QP is in the error state or closed (not a refusal of
   * this batch alone); `posted`: the batch was posted (else refused before).
   */
  batchFailed(error: Error, linkBroken: boolean, posted: boolean): void
}

export class QpPoster {
  readonly #queue: PostSource[] = []
  #inflight = 0
  readonly #depth: number
  readonly #batch: number

  constructor(readonly qp: QueuePair, readonly index: number, batchWrs: number) {
    this.#depth = qp.caps.maxSendWr
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

  /** Posts batches while the send queue has room; one batch per transfer per turn. */
  pump(): void {
    while (this.#queue.length > 0 && this.#inflight + this.#batch <= this.#depth) {
      const source = this.#queue.shift()!
      if (source.settled) continue
      let batch: PostedBatch
      try {
        batch = source.postNext(this.index, this.#batch, this.qp)
      } catch (error) {
        source.batchFailed(error as Error, this.#linkBroken(), false)
        continue
      }
      if (source.hasMore(this.index)) this.#queue.push(source)
      const { wrs } = batch
      if (wrs === 0) continue
      this.#inflight += wrs
      batch.done.then(() => {
        this.#inflight -= wrs
        source.batchDone(batch)
        this.pump()
      }, (error: Error) => {
        this.#inflight -= wrs
        source.batchFailed(error, this.#linkBroken(), true)
        this.pump()
      })
    }
  }

  /** Whether this QP is closed or in the error state (else a failed batch was refused alone). */
  #linkBroken(): boolean {
    return this.qp.closed || this.qp.error !== undefined
  }

  /** Drops every queued transfer (the link failed; they were rejected). */
  clear(): void {
    this.#queue.length = 0
  }
}
