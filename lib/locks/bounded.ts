// The bounds of lock operations (acquire, release, renew, fence): each call
// gets a deadline, and one timer per table watches every call in flight,
// instead of one timer per atomic (the atomics then take the QP's fast path:
// compareAndSwap()/fetchAndAdd() without options) or even one per call: a
// Node timer set and cleared costs thousands of instructions. The calls in
// flight are an array each knows its place in (no hashing: a Set whose only
// entry comes and goes rehashes every few calls). An abort listener is added
// only for a call given a signal.
import { performance } from 'node:perf_hooks'

export class Watchdog {
  readonly #live: Bound[] = []
  #timer: ReturnType<typeof setTimeout> | undefined
  #armedFor = Infinity // the deadline the timer fires at

  /**
   * A bound until `deadline` (a performance.now() time). Nothing is made for
   * its errors until one fires: `errors` makes them then, from the bound's
   * fields (no closure per call).
   */
  start(deadline: number, signal: AbortSignal | undefined, errors: BoundErrors, lock: number, timeoutMs: number): Bound {
    const bound = new Bound(this, deadline, signal, errors, lock, timeoutMs)
    bound.index = this.#live.push(bound) - 1
    if (deadline < this.#armedFor) this.#arm(deadline)
    return bound
  }

  /** @internal Removes a bound still watched (the last one takes its place). */
  remove(bound: Bound): void {
    const live = this.#live
    const at = bound.index
    if (at < 0) return
    bound.index = -1
    const last = live.pop()!
    if (last !== bound) live[last.index = at] = last
  }

  #arm(deadline: number): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    this.#armedFor = deadline
    // Unreferenced: an atomic in flight keeps the loop alive through its CQ, a backoff through its own timer.
    this.#timer = setTimeout(this.#check, Math.max(0, deadline - performance.now()))
    this.#timer.unref()
  }

  readonly #check = (): void => {
    this.#timer = undefined
    this.#armedFor = Infinity
    const now = performance.now()
    let next = Infinity
    for (const bound of [...this.#live]) { // expire() removes from the array
      if (bound.deadline <= now) bound.expire()
      else if (bound.deadline < next) next = bound.deadline
    }
    if (next !== Infinity) this.#arm(next)
  }
}

/** How the errors of a kind of bound are made, from the bound, when one fires. */
export interface BoundErrors {
  timedOut(bound: Bound): Error
  aborted(bound: Bound): Error
}

export class Bound {
  readonly deadline: number
  /** @internal Its place among the watchdog's live bounds, -1 once removed. */
  index = -1
  /** What its errors say: the lock, the timeout the deadline came from, and an acquire's progress so far. */
  readonly lock: number
  readonly timeoutMs: number
  readonly signal: AbortSignal | undefined
  attempts = 0
  last = 0n // the last lock word an acquire's CAS found
  #reject: ((error: Error) => void) | undefined
  #failure: Error | undefined
  readonly #watchdog: Watchdog
  readonly #errors: BoundErrors
  readonly #onAbort: (() => void) | undefined

  constructor(watchdog: Watchdog, deadline: number, signal: AbortSignal | undefined, errors: BoundErrors, lock: number, timeoutMs: number) {
    this.#watchdog = watchdog
    this.deadline = deadline
    this.#errors = errors
    this.lock = lock
    this.timeoutMs = timeoutMs
    this.signal = signal
    if (signal !== undefined) {
      this.#onAbort = () => this.#fail(errors.aborted(this))
      if (signal.aborted) this.#onAbort()
      else signal.addEventListener('abort', this.#onAbort, { once: true })
    }
  }

  /** Set once the time ran out or the signal aborted. */
  get failure(): Error | undefined { return this.#failure }

  /**
   * `promise`, or the bound's error if it comes first. An atomic cut off this
   * way may still execute at the responder (as one that timed out always could).
   */
  wait<T>(promise: Promise<T>): Promise<T> {
    if (this.#failure !== undefined) {
      promise.catch(() => {}) // settles later; nobody waits for it any more
      return Promise.reject(this.#failure)
    }
    return new Promise<T>((resolve, reject) => {
      this.#reject = reject
      promise.then(resolve, reject)
    })
  }

  /** The operation is over: no longer watched. */
  end(): void {
    this.#watchdog.remove(this)
    if (this.#onAbort !== undefined) this.signal!.removeEventListener('abort', this.#onAbort)
    this.#reject = undefined
  }

  /** @internal The watchdog found the deadline passed. */
  expire(): void { this.#fail(this.#errors.timedOut(this)) }

  #fail(error: Error): void {
    if (this.#failure !== undefined) return
    this.#failure = error
    this.#watchdog.remove(this)
    this.#reject?.(error)
  }
}
