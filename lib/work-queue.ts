// Slot accounting for one work queue (send or receive): requests that would
// overflow the queue wait in order until completions free slots, instead of
// failing with ENOMEM from the provider.
interface Waiting { slots: number; post: () => void; reject: (error: Error) => void }

export class WorkQueueSlots {
  used = 0
  readonly #waiting: Waiting[] = []

  constructor(readonly capacity: number) {}

  /** Whether `slots` can be posted now (nothing waits before them and they fit). */
  fitsNow(slots: number): boolean {
    return this.#waiting.length === 0 && this.used + slots <= this.capacity
  }

  /** Runs post() now if `slots` fit, else when they do (or reject() if the queue is failed first). */
  whenFree(slots: number, post: () => void, reject: (error: Error) => void): void {
    if (this.#waiting.length === 0 && this.used + slots <= this.capacity) post()
    else this.#waiting.push({ slots, post, reject })
  }

  release(slots: number): void {
    this.used -= slots
    while (this.#waiting.length > 0 && this.used + this.#waiting[0]!.slots <= this.capacity) {
      this.#waiting.shift()!.post()
    }
  }

  /** Rejects every request still waiting for a slot. */
  fail(error: Error): void {
    for (const waiting of this.#waiting.splice(0)) waiting.reject(error)
  }
}
