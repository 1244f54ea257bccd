// One poster per data QP of a peer. Transfers queue on it; it posts their
// slices in batches (one postBatch, one doorbell and one signaled completion
// per batch), taking turns between transfers (round robin: hundreds of
// concurrent transfers share the QP fairly), and never has more work
// requests in flight than the QP's send queue holds: the rest waits here,
// in JS, instead of failing with ENOMEM.
import type { BatchOperation, QueuePair } from '../queue-pair.js'

/** A transfer's work for one QP. */
export interface PostSource {
  /** Settled (failed, timed out, aborted): post nothing more for it. */
  readonly settled: boolean
  /** Whether slices remain for QP `q`. */
  hasMore(q: number): boolean
  /** Up to `max` operations for QP `q`, and the bytes they move. */
  take(q: number, max: number): { ops: BatchOperation[]; bytes: number }
  batchDone(bytes: number, wrs: number): void
  /** `linkBroken`: the QP is in the error state or closed (not a refusal of this batch alone). */
  batchFailed(error: Error, linkBroken: boolean): void
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
      const { ops, bytes } = source.take(this.index, this.#batch)
      if (source.hasMore(this.index)) this.#queue.push(source)
      if (ops.length === 0) continue
      const wrs = ops.length
      this.#inflight += wrs
      this.qp.postBatch(ops).then(() => {
        this.#inflight -= wrs
        source.batchDone(bytes, wrs)
        this.pump()
      }, (error: Error) => {
        this.#inflight -= wrs
        source.batchFailed(error, this.qp.closed || this.qp.error !== undefined)
        this.pump()
      })
    }
  }

  /** Drops every queued transfer (the link failed; they were rejected). */
  clear(): void {
    this.#queue.length = 0
  }
}
