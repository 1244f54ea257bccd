// The one reader of a CQ's output words. The addon polls completions into
// `words`; this delivers each to the request it belongs to, in order, once.
//
// Rules (docs/architecture.md, "Dispatch"):
// - Re-entrant by design: the batch cursor lives here, not in a loop's locals.
//   A poll asked for while a batch is delivered (a handler's cq.poll(), a QP
//   closed from a handler) first delivers the rest of that batch, so the words
//   are never overwritten while entries in them wait.
// - A throwing handler is contained per completion: its exception is reported
//   as uncaught (once, in a microtask) and the batch goes on.
// - Reports found by a post's own poll are held in a FIFO and delivered after
//   the post returns (a handler never runs inside a post call).
import { markAsUntransferable } from 'node:worker_threads'
import type { RdmaError } from '../core/errors.js'
import type { CompletionEntry } from './pending.js'
import { COMPLETION_WORDS } from '../native/addon.js'
import { PROMISE_WR_ID_BASE } from './wr-ids.js'

const TWO_32 = 4294967296

/** A queue pair (or SRQ) whose queues complete here, as the dispatch sees it. */
export interface CompletionOwner {
  /** The request (or ring of requests) a completion belongs to (by wr_id). */
  pendingFor(wrId: number): { complete(entry: CompletionEntry): void } | undefined
  /** The CQ failed: no completion will arrive; reject every request waiting for one. */
  failAll(error: RdmaError): void
}

/** Who receives held reports: a ring of tagged requests, with its handler. */
export interface ReportTarget {
  readonly handler: (tag: number, error: RdmaError | undefined) => void
}

/** An exception thrown by user code inside a delivery: uncaught, as from the event loop, without stopping the others. */
export function reportUncaught(thrown: unknown): void {
  queueMicrotask(() => { throw thrown })
}

const RESOLVED = Promise.resolve()

function newEntry(): CompletionEntry {
  return {
    wrId: 0, status: 0, opcode: 0, byteLength: 0, immOrRkey: 0, qpn: 0, srcQp: 0,
    wcFlags: 0, pkeyIndex: 0, slid: 0, sl: 0, dlidPathBits: 0, vendorError: 0,
  }
}

export class CompletionDispatch {
  /** The completions, then one count word (written by the native poll). Cannot be transferred away from the addon. */
  readonly words: Uint32Array
  /** The count word: completions the last native poll wrote. */
  readonly countWord: Uint32Array
  /** Completions one native poll hands over. */
  readonly capacity: number
  readonly #owners = new Map<number, WeakRef<CompletionOwner>>() // weak: a QP can still be collected
  /**
   * The owner of the last completion, held until the queue is idle again:
   * each WeakRef.deref() adds its target to the set kept alive until the
   * microtask checkpoint ends (~0.25k instructions per completion), and
   * completions come in runs from the same few QPs.
   */
  #lastQpn = -1
  #lastOwner: CompletionOwner | undefined
  /** The batch in the words: entries [next, count) are not delivered yet. */
  #next = 0
  #count = 0
  #depth = 0
  /** Reused for every completion at depth 1: a request reads what it needs and keeps nothing. */
  readonly #entry = newEntry()
  // Held reports: a FIFO in three parallel arrays, [head, tail) waiting.
  readonly #heldTargets: Array<ReportTarget | undefined> = []
  readonly #heldTags: number[] = []
  readonly #heldErrors: Array<RdmaError | undefined> = []
  #heldHead = 0
  #heldTail = 0
  #heldScheduled = false
  /** True while delivering what a post found by polling right after posting: reports are held. */
  holding = false

  constructor(capacity: number) {
    this.capacity = capacity
    this.words = new Uint32Array(capacity * COMPLETION_WORDS + 1)
    // structuredClone(..., { transfer }) or postMessage() would free the memory the addon polls into.
    markAsUntransferable(this.words.buffer)
    this.countWord = this.words.subarray(capacity * COMPLETION_WORDS)
  }

  /** Whether a batch is being delivered (a handler is on the stack). */
  get dispatching(): boolean { return this.#depth !== 0 }

  /** Entries of the current batch not delivered yet. */
  get undelivered(): number { return this.#count - this.#next }

  addOwner(qpn: number, owner: CompletionOwner): void {
    this.#owners.set(qpn, new WeakRef(owner))
    if (qpn === this.#lastQpn) this.forgetOwner() // a reused QP number
  }

  removeOwner(qpn: number): void {
    this.#owners.delete(qpn)
    if (qpn === this.#lastQpn) this.forgetOwner()
  }

  /** The owners alive now (the CQ failed: each fails its requests). */
  owners(): CompletionOwner[] {
    const alive: CompletionOwner[] = []
    for (const ref of this.#owners.values()) {
      const owner = ref.deref()
      if (owner !== undefined) alive.push(owner)
    }
    return alive
  }

  /** Idle: a dropped QP can be collected. */
  forgetOwner(): void {
    this.#lastQpn = -1
    this.#lastOwner = undefined
  }

  /** Whether the last delivered completion had an owner (the queue keeps it until idle). */
  get holdsOwner(): boolean { return this.#lastOwner !== undefined }

  /**
   * Delivers the `count` completions a native poll just wrote. The previous
   * batch must be delivered (finishBatch()) before the native poll that
   * wrote these.
   */
  deliver(count: number): void {
    this.#next = 0
    this.#count = count
    this.#deliverRest()
  }

  /** Delivers what is left of the current batch (from inside a delivery: the rest, now). Returns how many. */
  finishBatch(): number {
    const left = this.#count - this.#next
    if (left > 0) this.#deliverRest()
    return left
  }

  #deliverRest(): void {
    // A nested delivery gets its own entry: the outer request may still read its own.
    const entry = this.#depth === 0 ? this.#entry : newEntry()
    const w = this.words
    this.#depth++
    try {
      while (this.#next < this.#count) {
        const o = this.#next++ * COMPLETION_WORDS
        const wrId = w[o]! + w[o + 1]! * TWO_32
        const status = w[o + 2]!
        const qpn = w[o + 6]!
        entry.wrId = wrId
        entry.status = status
        entry.qpn = qpn
        entry.vendorError = w[o + 13]!
        // A ring's request (the promises' fast path, tagged) that succeeded
        // needs no more of the entry; the rest is read for the others.
        if (wrId < PROMISE_WR_ID_BASE || status !== 0) {
          entry.opcode = w[o + 3]!
          entry.byteLength = w[o + 4]!
          entry.immOrRkey = w[o + 5]!
          entry.srcQp = w[o + 7]!
          entry.wcFlags = w[o + 8]!
          entry.pkeyIndex = w[o + 9]!
          entry.slid = w[o + 10]!
          entry.sl = w[o + 11]!
          entry.dlidPathBits = w[o + 12]!
        }
        let owner = this.#lastOwner
        if (qpn !== this.#lastQpn) {
          owner = this.#owners.get(qpn)?.deref()
          if (owner === undefined) continue // its QP is gone: nothing waits for it
          this.#lastQpn = qpn
          this.#lastOwner = owner
        }
        const request = owner!.pendingFor(wrId)
        if (request === undefined) continue
        try {
          request.complete(entry)
        } catch (thrown) {
          reportUncaught(thrown) // the entry that threw was consumed; the batch goes on
        }
      }
    } finally {
      this.#depth--
    }
  }

  /** A tagged request's report: held while a post dispatches, else delivered now (a throwing handler contained). */
  report(target: ReportTarget, tag: number, error: RdmaError | undefined): void {
    if (this.holding) return this.#hold(target, tag, error)
    try {
      target.handler(tag, error)
    } catch (thrown) {
      reportUncaught(thrown)
    }
  }

  #hold(target: ReportTarget, tag: number, error: RdmaError | undefined): void {
    const at = this.#heldTail++
    this.#heldTargets[at] = target
    this.#heldTags[at] = tag
    this.#heldErrors[at] = error
    if (!this.#heldScheduled) {
      this.#heldScheduled = true
      void RESOLVED.then(this.deliverHeld)
    }
  }

  /** Whether posts hold reports not yet delivered. */
  get reportsHeld(): boolean { return this.#heldHead !== this.#heldTail }

  /**
   * Held reports, delivered now in the order they were held (from a
   * microtask, or an explicit cq.poll()). Re-entrant: a handler that polls
   * continues the same queue, so each report goes out once.
   */
  readonly deliverHeld = (): void => {
    this.#heldScheduled = false
    while (this.#heldHead !== this.#heldTail) {
      const at = this.#heldHead++
      const target = this.#heldTargets[at]!
      const tag = this.#heldTags[at]!
      const error = this.#heldErrors[at]
      this.#heldTargets[at] = undefined
      this.#heldErrors[at] = undefined
      if (this.#heldHead === this.#heldTail) this.#heldHead = this.#heldTail = 0 // empty: start over (slots kept)
      try {
        target.handler(tag, error)
      } catch (thrown) {
        reportUncaught(thrown)
      }
    }
  }
}
