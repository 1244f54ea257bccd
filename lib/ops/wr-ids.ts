// The work-request id space. A wr_id is a 64-bit field; ours stay below 2^53
// (exact in a JS number) and say by their range who keeps the request:
//   [1, 2^50)      requests with a Pending object on a QP's own queues
//   [2^50, 2^51)   receives posted to an SRQ (a QP's completion may be either)
//   [2^51, 2^52)   the promises' fast path (PromiseOps: a ring's base + sequence)
//   [2^52, 2^53)   tagged requests (TaggedOps: a ring's base + sequence)
// Completions are routed by QP number, and one left in a CQ by a destroyed QP
// must not match a request of a new QP that got the same number: the Pending
// ranges each have one allocator for the process, and each ring (one per QP
// and path) gets its own span of 2^32 ids, its generation.
export const QP_WR_ID_BASE = 1
export const SRQ_WR_ID_BASE = 2 ** 50
export const PROMISE_WR_ID_BASE = 2 ** 51
export const TAGGED_WR_ID_BASE = 2 ** 52

/** Consecutive wr_ids for Pending requests. */
export class WrIdAllocator {
  #next: number
  constructor(base: number) { this.#next = base }
  /** `count` consecutive ids; returns the first. */
  take(count: number): number {
    const first = this.#next
    this.#next += count
    return first
  }
}

/** The ids of every QP's Pending requests. */
export const QP_WR_IDS = new WrIdAllocator(QP_WR_ID_BASE)
/** The ids of every SRQ's receives. */
export const SRQ_WR_IDS = new WrIdAllocator(SRQ_WR_ID_BASE)

/** Ids per ring: its sequence numbers wrap at 2^32 (ring slots are `sequence & mask`). */
export const RING_SEQUENCES = 2 ** 32
/** Rings before a span is given out again: 2^51 / 2^32 fit the promise range (and half the tagged one). */
export const RING_GENERATIONS = 2 ** 19
let ringGeneration = 0

/** A new ring's first wr_id in `range` (PROMISE_WR_ID_BASE or TAGGED_WR_ID_BASE): the next generation's span. */
export function ringWrIdBase(range: number): number {
  const generation = ringGeneration
  ringGeneration = (generation + 1) % RING_GENERATIONS
  return range + generation * RING_SEQUENCES
}

/** The sequence number after `seq`, wrapping at RING_SEQUENCES. */
export function nextSequence(seq: number): number {
  return (seq + 1) >>> 0
}
