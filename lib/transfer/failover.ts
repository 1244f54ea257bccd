// A run's share of its link's rails (rails.ts), made only when the link has
// several: the bytes each rail confirmed and when (the link's RailMeter
// learns the rates from them), and failover. When a rail other than rail 0
// fails, the slices its lanes had not confirmed (posted and flushed, or not
// posted yet) are posted again on the lanes of the rails still up. A
// notified write owes the peer the markers its failed lanes never sent: they
// go (on QP 0, alone) once every slice is confirmed, so the notification
// still comes after all the data.
import type { PostSource } from './poster.js'

/** What a link with several rails does for its runs (link.ts implements it). */
export interface RailLink {
  /** A batch on rail `rail` (> 0) failed with its QP in the error state. True: the rail is (now) down and its slices move; false: the link is broken. */
  railFailed(rail: number, error: Error): boolean
  /** Slices of `run` were put back: the lanes still up take them. */
  wakeUp(run: PostSource): void
  /** At a run's success: the bytes each rail moved and the ms from its start to the rail's last completion. */
  railMeasured(bytes: Float64Array, ms: Float64Array): void
  /** Posts `count` markers of notice `seq` alone (the markers a notified write's failed lanes owe). */
  railMarkers(seq: number, count: number): Promise<void>
}

export class RunRails {
  /** Ranges of slices [from, to) to post on any lane up, as pairs. */
  readonly #ranges: number[] = []
  /** Lanes whose rail failed: they post nothing more. */
  readonly #down: Uint8Array
  /** Lanes whose last batch (with its notice marker) was confirmed. */
  readonly #tailed: Uint8Array
  /** Bytes each rail confirmed, and the time (performance.now()) of its last completion. */
  readonly bytes: Float64Array
  readonly last: Float64Array

  constructor(readonly link: RailLink, lanes: number, rails: number) {
    this.#down = new Uint8Array(lanes)
    this.#tailed = new Uint8Array(lanes)
    this.bytes = new Float64Array(rails)
    this.last = new Float64Array(rails)
  }

  get pending(): boolean { return this.#ranges.length > 0 }
  get anyDown(): boolean { return this.#down.includes(1) }
  isDown(q: number): boolean { return this.#down[q] === 1 }
  markDown(q: number): void { this.#down[q] = 1 }

  /** A batch of lane `q` on `rail` completed at `now`; `tailed`: it carried the lane's notice marker. */
  confirmed(rail: number, q: number, bytes: number, tailed: boolean, now: number): void {
    this.bytes[rail] += bytes
    this.last[rail] = now
    if (tailed) this.#tailed[q] = 1
  }

  /** The run succeeded: tells the link's meter what each rail did. */
  measure(started: number): void {
    const ms = new Float64Array(this.last.length)
    for (let r = 0; r < ms.length; r++) ms[r] = (this.last[r] || started) - started
    this.link.railMeasured(this.bytes, ms)
  }

  put(from: number, to: number): void {
    if (to > from) this.#ranges.push(from, to)
  }

  /** Up to `max` slices of one range to post again, or undefined when none is left. */
  take(max: number): { from: number; to: number } | undefined {
    if (this.#ranges.length === 0) return undefined
    const to = this.#ranges.pop()!
    const from = this.#ranges.pop()!
    const end = Math.min(to, from + max)
    if (end < to) this.#ranges.push(end, to)
    return { from, to: end }
  }

  /** Markers owed for a notified write: lanes with slices (`bounds`) whose marker was not confirmed. */
  owedMarkers(bounds: Uint32Array): number {
    if (!this.anyDown) return 0
    let owed = 0
    for (let q = 0; q < this.#down.length; q++) if (bounds[q + 1]! > bounds[q]! && this.#tailed[q] === 0) owed++
    return owed
  }
}
