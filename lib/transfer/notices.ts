// Notifications that ride with the data on an RDMA link. A notified write's
// last batch on each data QP it uses ends with a SEND_WITH_IMM whose
// immediate is the notification's number on the link (numbered in call
// order): on the first QP that send carries the message, on the others
// nothing (a marker). RC completes a receive only after the WRITEs posted
// before its SEND on that QP are placed, so once the message and every
// marker are in, the data is in place: the receiver raises the
// notification then, and in number order. A read's notification, and
// notify()'s, are one such message after the data (or alone). A transfer
// that fails on a healthy link sends a skip for its number, so the
// receiver does not wait for it. One one-way trip, no round trip after the
// data's completion, and one wakeup on the receiver.
import { Access, SendFlags, WrOpcode } from '../core/constants.js'
import { RdmaError } from '../core/errors.js'
import type { LocalSlice, MemoryRegion } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { ReceiveCompletion } from '../verbs/receive-completion.js'
import { MAX_NOTIFICATION_BYTES, protocolError } from './control.js'

/** A message's header: the parts (QPs) of its transfer, and the kind of payload. */
export const HEADER = 2
/** Receive buffer (and send slot) of one notice: the header and the largest notification. */
export const NOTICE_BYTES = HEADER + MAX_NOTIFICATION_BYTES
/** Receives each data QP keeps posted for notices (more in flight wait on RNR retries). */
export const NOTICE_RECEIVES = 32
export const KIND_TEXT = 0
export const KIND_BYTES = 1
/** Numbers are 31 bits; the immediate's top bit marks a skip. */
const SEQ_MASK = 0x7fffffff
const SKIP = 0x80000000

/** The extra work request a batch ends with: the notice's immediate, and the message slot on the QP that carries it. */
export interface NoticeTail { imm: number; slot: LocalSlice | undefined; length: number }

/** Appends `tail` as a signaled SEND_WITH_IMM at work request `wrId` (the encoder of qp-lane.ts). */
export function encodeTail(enc: { addOne(wrId: number, opcode: number, flags: number, address: number, length: number, lkey: number, remoteLo: number, remoteHi: number, rkey: number, imm: number): number },
  wrId: number, tail: NoticeTail): void {
  const slot = tail.slot
  enc.addOne(wrId, WrOpcode.SendWithImm, SendFlags.Signaled, slot ? slot.address : 0, slot ? tail.length : 0, slot ? slot.lkey : 0, 0, 0, 0, tail.imm)
}

/** The sending half on a link: numbers in call order. */
export class NoticeNumbers {
  #next = 0
  take(): number {
    const seq = this.#next
    this.#next = (this.#next + 1) & SEQ_MASK
    return seq
  }
}

export function skipTail(seq: number): NoticeTail { return { imm: (SKIP | seq) >>> 0, slot: undefined, length: 0 } }

/** A message's header and payload (copied: the buffer is posted again). */
function parse(bytes: Uint8Array, wc: ReceiveCompletion): ParsedNotice {
  const parts = bytes[0]!
  const kind = bytes[1]!
  if (wc.byteLength < HEADER || parts < 1 || (kind !== KIND_TEXT && kind !== KIND_BYTES)) throw protocolError(`The peer sent a malformed notice (${wc.byteLength} bytes, parts ${parts}, kind ${kind})`)
  const body = Buffer.from(bytes.subarray(HEADER, wc.byteLength))
  return { parts, message: kind === KIND_TEXT ? body.toString() : body }
}

/** `a` comes before `b` in the 31-bit numbering (wrapping). */
function before(a: number, b: number): boolean { return a !== b && ((b - a) & SEQ_MASK) < 0x40000000 }

interface Arriving { parts: number; markers: number; message: string | Buffer | undefined }

/** What one notice receive carried: a message (with its transfer's parts) or, with none, a marker or a skip. */
export interface ParsedNotice { parts: number; message: string | Buffer }

/**
 * The order of a link's incoming notices: counts the parts of each number
 * and hands whole ones to `deliver` in number order; a skipped number is
 * passed over (and its late markers ignored). A malformed sequence throws
 * ERR_TRANSFER_PROTOCOL.
 */
export class NoticeOrder {
  readonly #arriving = new Map<number, Arriving>()
  readonly #skipped = new Set<number>()
  #next: number

  /** `first`: the number the link starts at (0; another only to test the wrap). */
  constructor(readonly deliver: (message: string | Buffer) => void, first = 0) { this.#next = first }

  /** Numbers waiting for a part (or for an earlier number). */
  get waiting(): number { return this.#arriving.size + this.#skipped.size }

  arrived(imm: number, parsed: ParsedNotice | undefined): void {
    const seq = imm & SEQ_MASK
    if (before(seq, this.#next)) return // a marker of a number already skipped past
    if (imm & SKIP) {
      this.#arriving.delete(seq)
      this.#skipped.add(seq)
    } else if (this.#skipped.has(seq)) {
      return
    } else {
      let entry = this.#arriving.get(seq)
      if (entry === undefined) this.#arriving.set(seq, entry = { parts: 0, markers: 0, message: undefined })
      if (parsed) {
        if (entry.message !== undefined) throw protocolError(`The peer sent notice ${seq} twice`)
        entry.parts = parsed.parts
        entry.message = parsed.message
      } else {
        entry.markers++
      }
      if (entry.message !== undefined && entry.markers > entry.parts - 1) throw protocolError(`The peer sent more parts of notice ${seq} than it announced`)
    }
    this.#drain()
  }

  /** Hands over every whole notice from the next number on, passing over the skipped. */
  #drain(): void {
    for (;;) {
      const seq = this.#next
      if (this.#skipped.delete(seq)) {
        this.#next = (seq + 1) & SEQ_MASK
        continue
      }
      const entry = this.#arriving.get(seq)
      if (entry === undefined || entry.message === undefined || entry.markers < entry.parts - 1) return
      this.#arriving.delete(seq)
      this.#next = (seq + 1) & SEQ_MASK
      this.deliver(entry.message)
    }
  }

  clear(): void {
    this.#arriving.clear()
    this.#skipped.clear()
  }
}

/** One receive buffer of the inbox, posted again after each notice with the same handlers (none made per notice). */
class NoticeReceive {
  /** The view made once: a buffer is read at every notice. */
  readonly bytes: Uint8Array
  constructor(readonly inbox: NoticeInbox, readonly qp: QueuePair, readonly slot: LocalSlice) { this.bytes = slot.bytes }

  post(): void { this.qp.recv(this.slot).then(this.#arrived, this.#failed) }

  readonly #arrived = (wc: ReceiveCompletion): void => this.inbox.arrived(this, wc)
  readonly #failed = (error: unknown): void => this.inbox.failed(error, this.qp)
}

/**
 * The receiving half: keeps NOTICE_RECEIVES receives posted on every data QP
 * (from the moment the QPs are connected) and hands whole notices over in
 * number order (NoticeOrder), once `listen` is called (those that came
 * before are held). A malformed notice or a failed receive is the link's
 * failure.
 */
export class NoticeInbox {
  /** The receive buffers, one region per PD (each rail's QPs are on a PD of their own: rails.ts). */
  readonly #regions = new Map<ProtectionDomain, MemoryRegion>()
  readonly #order = new NoticeOrder((message) => {
    if (this.#onNotice) this.#onNotice(message)
    else this.#held.push(message)
  })
  readonly #held: Array<string | Buffer> = []
  #onNotice: ((message: string | Buffer) => void) | undefined
  #onFailure: ((error: Error) => void) | undefined
  #failure: Error | undefined
  #closed = false

  constructor(readonly qps: readonly QueuePair[]) {
    const counts = new Map<ProtectionDomain, number>()
    for (const qp of qps) counts.set(qp.pd, (counts.get(qp.pd) ?? 0) + 1)
    try {
      for (const [on, count] of counts) this.#regions.set(on, on.allocRegion(count * NOTICE_RECEIVES * NOTICE_BYTES, Access.LocalWrite))
    } catch (error) {
      this.close()
      throw error
    }
  }

  /** Posts the receives (the QPs are connected). */
  start(): void {
    const at = new Map<ProtectionDomain, number>()
    for (const qp of this.qps) {
      const region = this.#regions.get(qp.pd) ?? this.#regions.values().next().value!
      let offset = at.get(qp.pd) ?? 0
      for (let i = 0; i < NOTICE_RECEIVES; i++, offset += NOTICE_BYTES) new NoticeReceive(this, qp, region.slice(offset, NOTICE_BYTES)).post()
      at.set(qp.pd, offset)
    }
  }

  /** A notice landed in `receive`'s buffer: read, the buffer posted again, the notice handed to the order. */
  arrived(receive: NoticeReceive, wc: ReceiveCompletion): void {
    if (this.#closed || this.#failure) return
    try {
      // The bytes are read before the buffer is posted again.
      const parsed = wc.byteLength > 0 ? parse(receive.bytes, wc) : undefined
      receive.post()
      if (wc.immediate === undefined) throw protocolError('The peer sent a notice without its number (a SEND without immediate data)')
      this.#order.arrived(wc.immediate, parsed)
    } catch (error) {
      this.#fail(error as Error)
    }
  }

  /** Several rails: a QP's receives were flushed; true when that is its rail's failure alone (rails.ts), not the link's. */
  onFlushed: ((qp: QueuePair, error: Error) => boolean) | undefined

  /** A receive failed: flushed (the QP went into the error state) or worse. */
  failed(error: unknown, qp?: QueuePair): void {
    if (this.#closed) return
    if ((error as RdmaError)?.code !== 'WR_FLUSH_ERR') return this.#fail(error as Error)
    if (qp && this.onFlushed?.(qp, error as Error)) return
    // Flushed: the QP went into the error state. Its cause (a send's error
    // completion, the peer going away) is reported first, if this side has
    // one; else this is the only sign of it.
    setImmediate(() => this.#fail(new RdmaError('A data QP went into the error state (its notice receives were flushed)', { code: 'ECONNRESET', cause: error })))
  }

  #fail(error: Error): void {
    if (this.#failure || this.#closed) return
    this.#failure = error
    this.#onFailure?.(error)
  }

  /** From now on, whole notices go to `onNotice` (those held first); the first failure to `onFailure`. */
  listen(onNotice: (message: string | Buffer) => void, onFailure: (error: Error) => void): void {
    this.#onFailure = onFailure
    for (const message of this.#held.splice(0)) onNotice(message)
    this.#onNotice = onNotice
    if (this.#failure) onFailure(this.#failure)
  }

  /** After the QPs closed (their receives flushed): frees the buffers. */
  close(): void {
    this.#closed = true
    this.#order.clear()
    for (const region of this.#regions.values()) {
      try { region.close() } catch { /* closed with the PD */ }
    }
  }
}
