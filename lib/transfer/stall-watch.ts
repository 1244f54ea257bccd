// The stall bound of a link's transfers, with one timer per link instead of
// one per transfer: a transfer only notes the time of its last completion
// (run.ts), and the timer, when it fires, fails the transfers idle for
// their bound and is armed again for the next one due. Arming and clearing
// a timer per transfer was a large part of a small transfer's cost (Node
// makes and drops a timer list when its only timer goes).
import { performance } from 'node:perf_hooks'

/** A transfer as the watch sees it. */
export interface Watched {
  /** Fails the transfer if it stalled; else the ms left of its bound (Infinity: nothing to watch). */
  stallLeft(now: number): number
}

export class StallWatch {
  #timer: NodeJS.Timeout | undefined
  /** When the timer fires (performance.now() ms). */
  #due = Infinity

  /** `runs`: the link's transfers under way (a run leaves it when it settles). */
  constructor(readonly runs: ReadonlySet<Watched>) {}

  /**
   * A transfer started with a stall bound passing at `deadline` (its start
   * plus its bound). The timer keeps the process alive while transfers are
   * under way, as a timer of each did.
   */
  started(deadline: number): void {
    if (this.#timer === undefined || deadline < this.#due) return this.#arm(deadline)
    this.#timer.ref()
  }

  /**
   * A transfer settled: with none left, the timer no longer keeps the
   * process alive (it ends when it fires). It is never cleared: a run failing
   * after its link closed may still wait for a batch, bounded by it.
   */
  settled(): void {
    if (this.runs.size === 0) this.#timer?.unref()
  }

  #arm(due: number): void {
    clearTimeout(this.#timer)
    this.#due = due
    this.#timer = setTimeout(this.#fire, Math.max(0, due - performance.now()))
  }

  readonly #fire = (): void => {
    this.#timer = undefined
    this.#due = Infinity
    const now = performance.now()
    let next = Infinity
    for (const run of this.runs) next = Math.min(next, run.stallLeft(now))
    if (next !== Infinity) this.#arm(now + next)
  }
}
