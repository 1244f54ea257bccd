// Requests in flight without an object per request: a ring slot each (the
// region it holds, its verb), indexed by the request's sequence number, which
// its wr_id carries above the ring's base (its own span of ids: wr-ids.ts). The caller takes a send slot and a
// CQ credit first, so at most `capacity` are in flight and slots never
// collide. Base of the tagged path (TaggedOps) and of the promises' fast path
// (PromiseOps); each says how a request is reported.
import type { RdmaError } from '../core/errors.js'
import { INFLIGHT, RELEASE, type HeldRegion } from './held-region.js'
import { nextSequence, ringWrIdBase } from './wr-ids.js'

/** What a ring needs of its QP. */
export interface RingOwner {
  /** A request of the ring finished: its send slot and CQ credit are free again, the CQ has one request less waiting. */
  ringRequestFinished(): void
  /** An error completion moved the QP to the error state. */
  failed(error: RdmaError): void
}

export abstract class RequestRing {
  /** Requests in flight. */
  inFlight = 0
  protected readonly mask: number
  protected readonly regions: Array<HeldRegion | undefined>
  protected readonly seqs: Float64Array
  protected readonly verbs: Uint8Array
  /** Already reported (the CQ failed): its completion or abandonment is not reported again. */
  protected readonly reported: Uint8Array
  /** The wr_id of sequence number 0: this ring's span in its range. */
  readonly wrIdBase: number
  #next = 0

  /** `range`: PROMISE_WR_ID_BASE or TAGGED_WR_ID_BASE. */
  constructor(readonly owner: RingOwner, capacity: number, range: number) {
    this.wrIdBase = ringWrIdBase(range)
    let size = 1
    while (size < capacity) size <<= 1
    this.mask = size - 1
    this.regions = new Array<HeldRegion | undefined>(size).fill(undefined)
    this.seqs = new Float64Array(size).fill(-1)
    this.verbs = new Uint8Array(size)
    this.reported = new Uint8Array(size)
  }

  /** Records a request about to be posted; returns its sequence number (its slot is `seq & mask`, its wr_id `wrIdBase + seq`). */
  protected claim(region: HeldRegion, verb: number): number {
    const seq = this.#next
    this.#next = nextSequence(seq)
    const slot = seq & this.mask
    this.regions[slot] = region
    this.seqs[slot] = seq
    this.verbs[slot] = verb
    this.reported[slot] = 0
    region[INFLIGHT]++
    this.inFlight++
    return seq
  }

  /** Undoes the claim of a request the provider refused (it is not reported). */
  remove(wrId: number): void {
    const slot = this.slotOf(wrId)
    if (slot >= 0) this.release(slot)
  }

  /** The slot of `wrId`'s request, or -1 if it is not in flight. */
  protected slotOf(wrId: number): number {
    const seq = wrId - this.wrIdBase
    const slot = seq & this.mask
    return this.seqs[slot] === seq && this.regions[slot] !== undefined ? slot : -1
  }

  /** The device is done with the slot's memory. */
  protected release(slot: number): void {
    this.regions[slot]![RELEASE]()
    this.regions[slot] = undefined
    this.seqs[slot] = -1
    this.inFlight--
    this.owner.ringRequestFinished()
  }

  /**
   * The QP was destroyed: the device is done with every buffer. Each request
   * not reported yet is reported with `error`, after the current call returns.
   */
  abandonAll(error: RdmaError): void {
    for (let slot = 0; slot <= this.mask; slot++) {
      if (this.regions[slot] === undefined) continue
      if (this.reported[slot] === 0) this.collect(slot)
      this.release(slot)
    }
    this.reportCollected(error)
  }

  /**
   * The CQ failed: no completion will come. Each request in flight is
   * reported with `error` (after the current call returns); its memory stays
   * in use until the QP is closed.
   */
  reportAll(error: RdmaError): void {
    for (let slot = 0; slot <= this.mask; slot++) {
      if (this.regions[slot] === undefined || this.reported[slot] === 1) continue
      this.reported[slot] = 1
      this.collect(slot)
    }
    this.reportCollected(error)
  }

  /** Keeps what reporting the slot's request needs (called before the slot is released). */
  protected abstract collect(slot: number): void
  /** Reports the requests collected since the last call with `error`, after the current call returns. */
  protected abstract reportCollected(error: RdmaError): void
}
