// Requests in flight of one QP or SRQ, by the wr_id of their last work
// request. A completion looks its request up here, and every request is
// added and removed once: with a Map that is three hash operations per
// operation (and its table's churn). Here a ring indexed by the low bits of
// the wr_id holds them: wr_ids are handed out in increasing order, so the
// requests in flight on one queue rarely share a slot; one that does (a
// receive left waiting while many sends passed) goes to a Map beside it.
import type { Pending } from './pending.js'

/** What a request's owner indexes its requests with (a Map fits too). */
export interface PendingIndex {
  readonly size: number
  get(wrId: number): Pending | undefined
  set(wrId: number, pending: Pending): unknown
  delete(wrId: number): unknown
  values(): Iterable<Pending>
}

export class PendingTable implements PendingIndex {
  readonly #ring: Array<Pending | undefined>
  readonly #mask: number
  readonly #overflow = new Map<number, Pending>()
  size = 0

  /** `depth`: how many requests may be in flight at once (the queues' depths). */
  constructor(depth: number) {
    let slots = 64
    while (slots < 2 * depth && slots < 1 << 16) slots *= 2
    this.#ring = new Array<Pending | undefined>(slots).fill(undefined)
    this.#mask = slots - 1
  }

  get(wrId: number): Pending | undefined {
    const pending = this.#ring[wrId & this.#mask]
    if (pending !== undefined && pending.lastWrId === wrId) return pending
    return this.#overflow.size === 0 ? undefined : this.#overflow.get(wrId)
  }

  set(wrId: number, pending: Pending): void {
    const at = wrId & this.#mask
    if (this.#ring[at] === undefined) this.#ring[at] = pending
    else this.#overflow.set(wrId, pending)
    this.size++
  }

  /** Removes the request whose last wr_id is `wrId` (its lastWrId must still be that). */
  delete(wrId: number): void {
    const at = wrId & this.#mask
    const pending = this.#ring[at]
    if (pending !== undefined && pending.lastWrId === wrId) {
      this.#ring[at] = undefined
      this.size--
    } else if (this.#overflow.delete(wrId)) {
      this.size--
    }
  }

  /**
   * The request whose work requests include `wrId`, which is not its last
   * (a batch's member that failed, or completed with completions 'each'): its
   * last wr_id follows `wrId`, so the slots after wrId's are searched first.
   */
  containing(wrId: number): Pending | undefined {
    const ring = this.#ring
    const mask = this.#mask
    for (let k = 0; k <= mask; k++) {
      const pending = ring[(wrId + k) & mask]
      if (pending !== undefined && pending.contains(wrId)) return pending
    }
    for (const pending of this.#overflow.values()) if (pending.contains(wrId)) return pending
    return undefined
  }

  values(): Pending[] {
    const all: Pending[] = []
    for (const pending of this.#ring) if (pending !== undefined) all.push(pending)
    for (const pending of this.#overflow.values()) all.push(pending)
    return all
  }
}
