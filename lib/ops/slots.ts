// Slot accounting for a bounded queue: a QP's send or receive queue, or a
// completion queue's entries (credits). Requests that would overflow it wait
// in order until completions free slots, instead of failing with ENOMEM from
// the provider (or, for a CQ, overrunning it and losing completions).
import { RdmaError } from '../core/errors.js'
import type { WaitOptions } from '../core/validate.js'

/** A request waiting for slots; its slots are taken before grant() runs. */
interface Waiter { readonly slots: number; readonly owner: unknown; grant(): void; reject(error: Error): void }

export class WorkQueueSlots {
  used = 0
  readonly #waiting: Waiter[] = []

  constructor(readonly capacity: number) {}

  /** Takes `slots` now if nothing waits before them and they fit. */
  tryTake(slots: number): boolean {
    if (this.#waiting.length !== 0 || this.used + slots > this.capacity) return false
    this.used += slots
    return true
  }

  /** Queues a waiter (after tryTake() failed): its slots are taken, in order, when they fit. */
  enqueue(waiter: Waiter): void {
    this.#waiting.push(waiter)
    this.#grantWaiting()
  }

  /** Removes a waiter that gave up (timeout, abort); false if it was not waiting. */
  cancel(waiter: Waiter): boolean {
    const index = this.#waiting.indexOf(waiter)
    if (index < 0) return false
    this.#waiting.splice(index, 1)
    this.#grantWaiting() // the ones behind it may fit now
    return true
  }

  release(slots: number): void {
    this.used -= slots
    if (this.#waiting.length !== 0) this.#grantWaiting() // per operation: no call when nothing waits
  }

  /** Rejects the waiting requests (of `owner`, or all). */
  fail(error: Error, owner?: unknown): void {
    const failing = owner === undefined ? this.#waiting.splice(0) : this.#waiting.filter((w) => w.owner === owner)
    if (owner !== undefined) for (const waiter of failing) this.#waiting.splice(this.#waiting.indexOf(waiter), 1)
    for (const waiter of failing) waiter.reject(error)
    if (owner !== undefined) this.#grantWaiting()
  }

  #grantWaiting(): void {
    while (this.#waiting.length > 0 && this.used + this.#waiting[0]!.slots <= this.capacity) {
      const waiter = this.#waiting.shift()!
      this.used += waiter.slots
      waiter.grant()
    }
  }
}

/**
 * A request that waits for slots in several queues in turn (its QP's work
 * queue, then its CQ's credits). `timeoutMs` and `signal` cover the whole
 * wait: on either, the request leaves the queue it waits in, gives back what
 * it took and is rejected. ready() receives what is left of the deadline.
 */
export class SlotWait implements Waiter {
  readonly #queues: readonly WorkQueueSlots[]
  #stage: number
  #done = false
  #timer: NodeJS.Timeout | undefined
  #deadline = 0
  #onAbort: (() => void) | undefined

  constructor(queues: readonly WorkQueueSlots[], taken: number, readonly slots: number, readonly owner: unknown,
    private readonly wait: WaitOptions, private readonly verb: string, private readonly qpn: number,
    private readonly ready: (wait: WaitOptions) => void, private readonly rejectFn: (error: Error) => void) {
    this.#queues = queues
    this.#stage = taken
  }

  start(): void {
    const { timeoutMs, signal } = this.wait
    if (timeoutMs !== undefined) {
      this.#deadline = Date.now() + timeoutMs
      this.#timer = setTimeout(() => this.#giveUp(new RdmaError(`${this.verb} timed out after ${timeoutMs} ms waiting for a queue slot`, {
        code: 'ETIMEDOUT', verb: this.verb, qpn: this.qpn,
      })), timeoutMs)
    }
    if (signal !== undefined) {
      this.#onAbort = () => this.#giveUp(abortError(this.verb, this.qpn, signal, ' while waiting for a queue slot'))
      signal.addEventListener('abort', this.#onAbort, { once: true })
    }
    this.#next()
  }

  /** Waiter: the current queue granted our slots. */
  grant(): void {
    this.#stage++
    this.#next()
  }

  /** Waiter: the current queue failed (its QP failed or closed). */
  reject(error: Error): void {
    this.#finish()
    this.#releaseTaken()
    this.rejectFn(error)
  }

  #next(): void {
    while (this.#stage < this.#queues.length) {
      const queue = this.#queues[this.#stage]!
      if (!queue.tryTake(this.slots)) return queue.enqueue(this) // grant() continues
      this.#stage++
    }
    if (this.#done) return
    this.#finish()
    const { timeoutMs, signal } = this.wait
    const left: WaitOptions = {}
    if (timeoutMs !== undefined) left.timeoutMs = Math.max(0, Math.ceil(this.#deadline - Date.now()))
    if (signal !== undefined) left.signal = signal
    this.ready(left)
  }

  #giveUp(error: Error): void {
    if (this.#done) return
    this.#queues[this.#stage]?.cancel(this)
    this.reject(error)
  }

  #releaseTaken(): void {
    for (let i = 0; i < this.#stage && i < this.#queues.length; i++) this.#queues[i]!.release(this.slots)
    this.#stage = 0
  }

  #finish(): void {
    this.#done = true
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    if (this.#onAbort !== undefined) this.wait.signal!.removeEventListener('abort', this.#onAbort)
    this.#timer = undefined
    this.#onAbort = undefined
  }
}

export function abortError(verb: string, qpn: number, signal: AbortSignal, when = ''): RdmaError {
  return new RdmaError(`${verb} was aborted${when}`, { code: 'ABORT_ERR', verb, qpn, cause: signal.reason })
}
