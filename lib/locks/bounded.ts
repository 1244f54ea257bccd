// One bound for all the atomics of one lock operation (acquire, release,
// renew, fence): a single timer and abort listener per call, instead of one
// timer per atomic, so that the atomics themselves take the QP's fast path
// (compareAndSwap()/fetchAndAdd() without options: no Pending object, no timer
// each; docs/locks.md, "Cost").
export class Bound {
  #timer: ReturnType<typeof setTimeout> | undefined
  #reject: ((error: Error) => void) | undefined
  #failure: Error | undefined
  readonly #signal: AbortSignal | undefined
  readonly #onAbort: (() => void) | undefined

  /** `onTimeout` makes the error once `ms` passed, `onAbort` the one of an aborted `signal`. */
  constructor(ms: number, onTimeout: () => Error, signal: AbortSignal | undefined, onAbort: () => Error) {
    this.#timer = setTimeout(() => this.#fail(onTimeout()), ms)
    if (signal !== undefined) {
      this.#signal = signal
      this.#onAbort = () => this.#fail(onAbort())
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

  /** Stops the timer and the abort listener: call once the operation is over. */
  end(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    this.#timer = undefined
    if (this.#onAbort !== undefined) this.#signal!.removeEventListener('abort', this.#onAbort)
    this.#reject = undefined
  }

  #fail(error: Error): void {
    if (this.#failure !== undefined) return
    this.#failure = error
    this.#timer = undefined
    this.#reject?.(error)
  }
}
