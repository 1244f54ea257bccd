// The sending half of an RDMA link's notices (notices.ts): numbers in call
// order, messages in send slots the device reads, and notices posted alone
// (a read's, notify()'s, a skip) through the poster of the control rail's
// first QP (QP 0 unless the link's control channel is on another rail:
// rails.ts), in turn with the transfers, so the send queue never holds more
// than it was sized for.
import { Access } from '../core/constants.js'
import type { LocalSlice } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import { HEADER, KIND_BYTES, KIND_TEXT, NOTICE_BYTES, NoticeNumbers, skipTail, type NoticeTail } from './notices.js'
import type { NoticePayload } from './notifications.js'
import type { CheckedPlan } from './plan.js'
import type { PostedBatch, PostSource, QpPoster } from './poster.js'
import type { QpLane } from './qp-lane.js'

const SLOTS_PER_PAGE = 32

/** A send slot and its bytes (the view made once). */
interface Slot { slice: LocalSlice; bytes: Uint8Array }

/** Send slots for notices, per PD, in pages registered on first need (as the atomic result slots are). */
class NoticeSlots {
  readonly #free: Slot[] = []
  constructor(readonly pd: ProtectionDomain) {}

  take(): Slot {
    if (this.#free.length === 0) {
      const region = this.pd.allocRegion(NOTICE_BYTES * SLOTS_PER_PAGE, Access.LocalWrite)
      for (let i = 0; i < SLOTS_PER_PAGE; i++) {
        const slice = region.slice(i * NOTICE_BYTES, NOTICE_BYTES)
        this.#free.push({ slice, bytes: slice.bytes })
      }
    }
    return this.#free.pop()!
  }

  give(slot: Slot): void { this.#free.push(slot) }
}

const slotPools = new WeakMap<ProtectionDomain, NoticeSlots>()

function slotsOf(pd: ProtectionDomain): NoticeSlots {
  let pool = slotPools.get(pd)
  if (pool === undefined) slotPools.set(pd, pool = new NoticeSlots(pd))
  return pool
}

/**
 * One notice with a message: its number, and the message in a send slot
 * until the device is done with it. `tailFor(q)` is what QP q's last batch
 * of a notified write ends with.
 */
export class OutgoingNotice {
  readonly #slots: NoticeSlots
  #slot: Slot | undefined
  readonly #length: number
  #posted = false

  constructor(pd: ProtectionDomain, readonly seq: number, readonly parts: number, readonly carrier: number, payload: NoticePayload) {
    this.#slots = slotsOf(pd)
    const slot = this.#slot = this.#slots.take()
    const bytes = slot.bytes
    bytes[0] = parts
    bytes[1] = payload.text === undefined ? KIND_BYTES : KIND_TEXT
    bytes.set(payload.bytes, HEADER)
    this.#length = HEADER + payload.bytes.length
  }

  /** The tail of QP `q`'s last batch: the message on the carrier, a marker elsewhere. */
  tailFor(q: number): NoticeTail {
    if (q !== this.carrier) return { imm: this.seq, slot: undefined, length: 0 }
    this.#posted = true
    return { imm: this.seq, slot: this.#slot?.slice, length: this.#length }
  }

  /** The batch that carried the message settled: the device is done with the slot. */
  release(): void {
    const slot = this.#slot
    if (slot === undefined) return
    this.#slot = undefined
    this.#slots.give(slot)
  }

  /** Its transfer settled: a slot never posted goes back now (a posted one when its batch settles). */
  settled(): void { if (!this.#posted) this.release() }
}

/** A notice posted alone on the sender's QP, as a one-request source of its poster. */
class NoticePost implements PostSource {
  #posted = false
  constructor(readonly lane: QpLane, readonly tail: NoticeTail, readonly release: () => void,
    readonly resolve: () => void, readonly reject: (error: Error) => void) {}

  get settled(): boolean { return this.#posted }
  hasMore(): boolean { return !this.#posted }

  postNext(): PostedBatch {
    this.#posted = true
    const done = this.lane.postNotice(this.tail)
    done.then(this.release, this.release)
    return { wrs: 0, bytes: 0, slots: 1, from: 0, to: 0, rail: this.lane.rail, q: this.lane.index, done }
  }

  batchDone(): void { this.resolve() }
  batchFailed(error: Error): void { this.reject(error) }
}

export class NoticeSender {
  readonly #numbers = new NoticeNumbers()
  readonly #queued = new Set<NoticePost>()
  #failure: Error | undefined

  readonly pd: ProtectionDomain

  /**
   * `poster`: the QP notices alone go on; `lanes`: the link's QPs, of which
   * `first`..`end` (the control channel's rail) carry a write's message when
   * the plan uses them: a rail that fails takes only markers with it.
   */
  constructor(readonly poster: QpPoster, readonly lanes: readonly QpLane[], readonly first = 0, readonly end = lanes.length) {
    this.pd = (poster.lane as QpLane).qp.pd
  }

  /** The next number, taken when the transfer (or notify()) is called. */
  take(): number { return this.#numbers.take() }

  /** A notified write's notice: the message rides on the first QP of the control rail the plan uses (else its first QP), markers on the others. */
  forWrite(seq: number, plan: CheckedPlan, payload: NoticePayload): OutgoingNotice {
    const used = (q: number) => plan.bounds[q + 1]! > plan.bounds[q]!
    let carrier = this.first
    while (carrier < this.end && !used(carrier)) carrier++
    if (carrier >= this.end) {
      carrier = 0
      while (!used(carrier)) carrier++
    }
    // The message's slot is memory of the carrier's PD (each rail's QPs are on a PD of their own).
    return new OutgoingNotice(this.lanes[carrier]?.qp.pd ?? this.pd, seq, plan.qps, carrier, payload)
  }

  /** A message alone (after a read's data, or notify()): resolves when the peer's device has it. */
  send(seq: number, payload: NoticePayload): Promise<void> {
    const notice = new OutgoingNotice(this.pd, seq, 1, 0, payload)
    return this.#post(notice.tailFor(0), () => notice.release())
  }

  /** A marker of notice `seq` alone (a write's lane whose rail failed owes it: failover.ts). */
  marker(seq: number): Promise<void> {
    return this.#post({ imm: seq, slot: undefined, length: 0 }, () => undefined)
  }

  /** The transfer numbered `seq` failed on a healthy link: the peer stops waiting for it. */
  skip(seq: number): void {
    this.#post(skipTail(seq), () => undefined).catch(() => undefined)
  }

  #post(tail: NoticeTail, release: () => void): Promise<void> {
    if (this.#failure) {
      release()
      return Promise.reject(this.#failure)
    }
    return new Promise<void>((resolve, reject) => {
      const post: NoticePost = new NoticePost(this.poster.lane as QpLane, tail, release,
        () => { this.#queued.delete(post); resolve() }, (error) => { this.#queued.delete(post); reject(error) })
      this.#queued.add(post)
      this.poster.add(post)
    })
  }

  /** The link failed: notices still queued are rejected (their slots freed). */
  fail(error: Error): void {
    this.#failure ??= error
    for (const post of [...this.#queued]) {
      if (post.settled) continue // posted: its completion (or flush) settles it
      this.#queued.delete(post)
      post.release()
      post.reject(error)
    }
  }
}
