// A run's share of a rail failure (rails.ts): when a rail other than the
// control channel's fails (or was down when the run started), the slices its
// lanes had not confirmed (posted and flushed, or not posted yet) are posted
// again on the lanes of the rails still up. A notified write owes the peer
// the markers its failed lanes never sent: they go (on the control rail's
// first QP, alone) once every slice is confirmed, so the notification still
// comes after all the data.
export class Resubmits {
  /** Ranges of slices [from, to) to post on any lane up, as pairs. */
  readonly #ranges: number[] = []
  /** Lanes whose rail failed: they post nothing more. */
  readonly #down: Uint8Array
  /** Lanes whose last batch (with its notice marker) was confirmed. */
  readonly #tailed: Uint8Array

  constructor(lanes: number) {
    this.#down = new Uint8Array(lanes)
    this.#tailed = new Uint8Array(lanes)
  }

  get pending(): boolean { return this.#ranges.length > 0 }
  get anyDown(): boolean { return this.#down.includes(1) }
  isDown(q: number): boolean { return this.#down[q] === 1 }
  markDown(q: number): void { this.#down[q] = 1 }
  tailed(q: number): void { this.#tailed[q] = 1 }

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
    let owed = 0
    for (let q = 0; q < this.#down.length; q++) if (bounds[q + 1]! > bounds[q]! && this.#tailed[q] === 0) owed++
    return owed
  }
}
