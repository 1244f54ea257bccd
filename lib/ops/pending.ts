// Work requests in flight: one Pending per promise, found by the wr_id of its
// last work request in its owner's table (per QP or SRQ, so that a dropped QP
// and its requests can be garbage-collected together). A Pending "settles" (its promise resolves or rejects) and
// separately "finishes" (the hardware is done with its memory: its last
// completion arrived or its queue pair was destroyed).
import { RdmaError } from '../core/errors.js'
import { wcStatusNames } from '../core/constants.js'
import type { CompletionStatusCode } from '../core/error-codes.js'
import { INFLIGHT, RELEASE, type HeldRegion } from './held-region.js'
import type { WaitOptions } from '../core/validate.js'
import type { PendingIndex } from './pending-table.js'

/** A completion as read from the CQ's output words. */
export interface CompletionEntry {
  wrId: number
  status: number
  opcode: number
  byteLength: number
  immOrRkey: number
  qpn: number
  srcQp: number
  wcFlags: number
  pkeyIndex: number
  slid: number
  sl: number
  dlidPathBits: number
  vendorError: number
}

/** What owns the queue a request was posted to (a QP, or an SRQ for receives). */
export interface PendingOwner {
  readonly qpn: number
  /** The owner's requests in flight, by the wr_id of their last work request. */
  readonly pendings: PendingIndex
  /** Called when a Pending of this owner finishes. */
  released(pending: Pending): void
  /** Called when a completion of this owner carries an error status. */
  failed(error: RdmaError): void
  /** Called when a receive completes after its promise timed out or was aborted. */
  orphaned(entry: CompletionEntry): void
}

/**
 * Liveness: a completion queue keeps the loop alive while it has pendings, and
 * the queue that counts them keeps `owner` (the QP or SRQ) reachable meanwhile.
 */
export interface PendingCounter { addPending(owner: object): void; removePending(): void }

export class Pending {
  settled = false
  finished = false
  /** Where its work requests start in the send buffer (sends gathered in one turn). */
  wordStart = 0
  #timer: NodeJS.Timeout | undefined
  #signal: AbortSignal | undefined
  #onAbort: (() => void) | undefined

  /** @internal made by the queues only */
  constructor(
    readonly owner: PendingOwner,
    readonly counter: PendingCounter | undefined,
    readonly queue: 'send' | 'recv',
    readonly verb: string,
    readonly firstWrId: number,
    public lastWrId: number,
    /** The regions the request names: one, or several (an array). */
    readonly regions: HeldRegion | readonly HeldRegion[],
    private readonly resolveFn: (value: any) => void, // eslint-disable-line @typescript-eslint/no-explicit-any
    private readonly rejectFn: (error: Error) => void,
    /** Turns the completion into the resolved value (default: the entry itself, which is reused: copy what you keep). */
    private readonly transform?: (entry: CompletionEntry) => unknown,
  ) {}

  /** Registers the request as in flight (call right before posting). */
  track(wait: WaitOptions): void {
    const regions = this.regions
    if (Array.isArray(regions)) for (const region of regions) region[INFLIGHT]++
    else (regions as HeldRegion)[INFLIGHT]++
    this.owner.pendings.set(this.lastWrId, this)
    this.counter?.addPending(this.owner)
    if (wait.timeoutMs !== undefined) {
      this.#timer = setTimeout(() => {
        this.reject(new RdmaError(`${this.verb} timed out after ${wait.timeoutMs} ms`, {
          code: 'ETIMEDOUT', verb: this.verb, wrId: this.lastWrId, qpn: this.owner.qpn,
        }))
      }, wait.timeoutMs)
    }
    if (wait.signal !== undefined) {
      this.#signal = wait.signal
      this.#onAbort = () => {
        this.reject(new RdmaError(`${this.verb} was aborted`, {
          code: 'ABORT_ERR', verb: this.verb, wrId: this.lastWrId, qpn: this.owner.qpn, cause: wait.signal?.reason,
        }))
      }
      // An already-aborted signal never fires 'abort'.
      if (wait.signal.aborted) return this.#onAbort()
      wait.signal.addEventListener('abort', this.#onAbort, { once: true })
    }
  }

  /** Undoes track() for a request that the queue refused. */
  untrack(): void {
    this.finish()
  }

  /** Number of work requests (queue slots) this request occupies. */
  get slots(): number { return this.lastWrId - this.firstWrId + 1 }

  /** After a partial post: only the first `posted` work requests reached the queue. */
  truncate(posted: number): void {
    const pendings = this.owner.pendings
    pendings.delete(this.lastWrId)
    this.lastWrId = this.firstWrId + posted - 1
    pendings.set(this.lastWrId, this)
  }

  contains(wrId: number): boolean {
    return wrId >= this.firstWrId && wrId <= this.lastWrId
  }

  /** A completion for this request arrived (its last WR, or an earlier WR that failed). */
  complete(entry: CompletionEntry): void {
    if (entry.wrId === this.lastWrId) this.finish()
    if (entry.status === 0) {
      if (entry.wrId === this.lastWrId && !this.settled) {
        this.settled = true
        this.clearWait()
        const transform = this.transform
        if (transform === undefined) {
          this.resolveFn(entry)
        } else {
          try { this.resolveFn(transform(entry)) } catch (error) { this.rejectFn(error as Error) }
        }
      } else if (this.settled && this.queue === 'recv') {
        this.owner.orphaned(entry) // a message landed in the buffer of a receive that timed out or was aborted
      }
      return
    }
    const error = completionError(entry, this.verb)
    if (entry.status !== 5 /* WR_FLUSH_ERR */) this.owner.failed(error)
    this.reject(error)
  }

  reject(error: Error): void {
    if (this.settled) return
    this.settled = true
    this.clearWait()
    this.rejectFn(error)
  }

  /** The hardware is done with this request's memory. */
  finish(): void {
    if (this.finished) return
    this.finished = true
    this.owner.pendings.delete(this.lastWrId)
    const regions = this.regions
    if (Array.isArray(regions)) for (const region of regions) region[RELEASE]()
    else (regions as HeldRegion)[RELEASE]()
    this.counter?.removePending()
    this.owner.released(this)
  }

  private clearWait(): void {
    if (this.#timer) clearTimeout(this.#timer)
    if (this.#signal && this.#onAbort) this.#signal.removeEventListener('abort', this.#onAbort)
    this.#timer = undefined
    this.#signal = undefined
  }
}

/** The owner's queue was destroyed: the device is done with every buffer, and each request fails with `error`. */
export function abandonAll(pendings: Iterable<Pending>, error: Error): void {
  for (const pending of [...pendings]) {
    pending.finish()
    pending.reject(error)
  }
}

export function completionError(entry: CompletionEntry, verb: string): RdmaError {
  const status: CompletionStatusCode = (wcStatusNames[entry.status] as CompletionStatusCode | undefined) ?? `STATUS_${entry.status}`
  return new RdmaError(`${verb} failed: ${status} (wr_id ${entry.wrId}, QP ${entry.qpn})`, {
    code: status, status, verb, wrId: entry.wrId, qpn: entry.qpn, vendorError: entry.vendorError,
  })
}
