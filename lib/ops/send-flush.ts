// The sends gathered in one turn of the event loop, posted together with one
// native call (one doorbell), and the blame when the provider refuses one:
// the requests before it reached the queue, it fails alone, the ones after
// it are posted again (or refused, if the refusal failed the QP).
import type { NativeQueuePair, PostFunction } from '../native/addon.js'
import { fromNative, type RdmaError } from '../core/errors.js'
import { WorkRequestEncoder } from './encoder.js'
import type { Pending } from './pending.js'
import type { WorkQueueSlots } from './slots.js'
import type { PostingCq } from './qp-queues.js'

/** What the flush needs of the queues. */
export interface FlushHost {
  readonly open: boolean
  readonly failure: RdmaError | undefined
  readonly sendSlots: WorkQueueSlots
  stateError(verb: string): RdmaError
  /** The provider refused `pending`: `posted` of its work requests reached the queue. */
  refused(pending: Pending, count: number, error: Error, slots: WorkQueueSlots, posted?: number): void
}

/** Runs `fn` at the end of the current microtask checkpoint (cheaper than queueMicrotask, which wraps each call in an AsyncResource). */
export const RESOLVED = Promise.resolve()

/** Sends gathered during one turn of the event loop, posted together. */
class SendBatch {
  readonly encoder = new WorkRequestEncoder()
  /**
   * The requests encoded, in order, in pendings[0, count); each knows where
   * its words start (Pending.wordStart). Emptied by count (and the slots
   * cleared), never by `length = 0`: that frees the array's storage, which
   * the next push allocates again (~0.5k instructions per operation, in
   * the runtime's length setter and the array's regrowth).
   */
  readonly pendings: Array<Pending | undefined> = []
  count = 0
  wrs = 0
  /** The native post function bound to `bound` (the encoder's buffer, replaced when it grows). */
  post: PostFunction | undefined
  bound: Uint32Array | undefined
}

export class GatheredSends {
  #batch = new SendBatch()
  #spare = new SendBatch()
  #flushScheduled = false
  readonly #handle: NativeQueuePair
  readonly #sendCq: PostingCq
  readonly #host: FlushHost

  constructor(handle: NativeQueuePair, sendCq: PostingCq, host: FlushHost) {
    this.#handle = handle
    this.#sendCq = sendCq
    this.#host = host
  }

  /** Sends gathered and not yet posted. */
  get count(): number { return this.#batch.count }

  /** Where the next gathered send is encoded (its Pending's wordStart is the encoder's `used` before). */
  get encoder(): WorkRequestEncoder { return this.#batch.encoder }

  /** A send encoded at its wordStart, of `count` work requests, joins the batch. */
  add(pending: Pending, count: number): void {
    const batch = this.#batch
    batch.pendings[batch.count++] = pending
    batch.wrs += count
  }

  /** Drops what a failed encode wrote from `wordStart` on. */
  truncate(wordStart: number): void {
    this.#batch.encoder.truncate(wordStart, this.#batch.wrs)
  }

  /** Flushes at the end of the current microtask checkpoint (once however many sends join). */
  flushLater(): void {
    if (this.#flushScheduled) return
    this.#flushScheduled = true
    void RESOLVED.then(this.flush)
  }

  /** Posts `count` work requests of the batch from `wordStart` with one native call; with `poll`, polls the send CQ right after. */
  #postFrom(batch: SendBatch, wordStart: number, count: number, poll: number): number {
    const words = batch.encoder.buffer
    if (batch.bound !== words) { // first use, or the encoder grew: bind the (new) buffer once
      batch.post = this.#handle.sendPoster(words, this.#sendCq.handle)
      batch.bound = words
    }
    return batch.post!(wordStart, count, poll)
  }

  /** Posts the sends gathered this turn; a request the provider refuses fails alone. */
  readonly flush = (): void => {
    this.#flushScheduled = false
    const host = this.#host
    const batch = this.#batch
    const entries = batch.pendings as Pending[] // [0, count) are set
    const length = batch.count
    if (length === 0) return
    // Swap buffers: sends made while this one is posted (e.g. by requests that
    // were waiting for the slots a refused request frees) go to the other.
    this.#batch = this.#spare
    this.#spare = batch
    const total = batch.wrs
    const cq = this.#sendCq
    let polled = -1 // completions the post polled; -1: poll separately
    try {
      if (!host.open) return // closing rejected them already
      const poll = cq.mayPollInline() ? 1 : 0
      let index = 0
      let wrsBefore = 0
      while (index < length) {
        try {
          const n = this.#postFrom(batch, entries[index]!.wordStart, total - wrsBefore, index === 0 ? poll : 0)
          if (index === 0 && poll) polled = n
          break
        } catch (cause) {
          const error = fromNative(cause) as RdmaError
          let posted = error.posted ?? 0
          while (posted >= entries[index]!.slots) { // these reached the queue
            posted -= entries[index]!.slots
            wrsBefore += entries[index]!.slots
            index++
          }
          const bad = entries[index]!
          const badCount = bad.slots
          host.refused(bad, badCount, error, host.sendSlots, posted)
          wrsBefore += badCount
          index++
          if (host.failure) { // the QP failed: the rest cannot be posted
            for (const rest of entries.slice(index, length)) host.refused(rest, rest.slots, host.stateError(rest.verb), host.sendSlots, 0)
            break
          }
        }
      }
    } finally {
      for (let i = 0; i < length; i++) batch.pendings[i] = undefined // the batch does not keep them alive
      batch.count = 0
      batch.wrs = 0
      batch.encoder.reset()
    }
    if (polled >= 0) cq.polledAfterPost(polled)
    else cq.pollAfterPost()
  }
}
