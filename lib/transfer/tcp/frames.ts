// The TCP link's wire: length-prefixed frames, each a fixed 32-byte header
// and a payload. A payload is read straight into where it belongs (a
// segment's bytes, a read's destination): one copy from the socket's chunk,
// none to assemble it first.
//
// header: u32 payload bytes | u8 type | u8 status | u16 0 | u32 batch | u32 segment key | f64 offset | u32 length | u32 0
import { RdmaError } from '../../core/errors.js'

export const HEADER = 32

export const FrameType = {
  /** JSON control message (the payload). */
  Control: 1,
  /** Write `length` bytes (the payload) at [key, offset]. */
  Write: 2,
  /** The last frame of a write batch: answer WriteAck. */
  WriteEnd: 3,
  WriteAck: 4,
  /** Read `length` bytes at [key, offset]: answered by ReadData. */
  Read: 5,
  ReadData: 6,
  /** The last frame of a read batch: answer ReadAck (after its ReadData). */
  ReadEnd: 7,
  ReadAck: 8,
} as const

/** Why a peer refused a batch (0: it did not). */
export const Refusal = { None: 0, Unknown: 1, Rights: 2, Bounds: 3 } as const

/** Largest control message accepted (JSON). */
export const MAX_CONTROL_BYTES = 1 << 20

export interface FrameHead {
  payload: number
  type: number
  status: number
  batch: number
  key: number
  offset: number
  length: number
}

export function writeHead(into: Buffer, at: number, type: number, status: number, batch: number, key: number, offset: number, length: number, payload: number): void {
  into.writeUInt32LE(payload, at)
  into[at + 4] = type
  into[at + 5] = status
  into.writeUInt16LE(0, at + 6)
  into.writeUInt32LE(batch >>> 0, at + 8)
  into.writeUInt32LE(key >>> 0, at + 12)
  into.writeDoubleLE(offset, at + 16)
  into.writeUInt32LE(length >>> 0, at + 24)
  into.writeUInt32LE(0, at + 28)
}

export function head(type: number, status: number, batch: number, key: number, offset: number, length: number, payload: number): Buffer {
  const b = Buffer.allocUnsafe(HEADER)
  writeHead(b, 0, type, status, batch, key, offset, length, payload)
  return b
}

/**
 * Where a frame's payload goes, decided from its header: a view to fill
 * (exactly `payload` bytes), or null to skip the bytes. `end` follows once
 * the payload is in (or at once for a frame without one).
 */
export interface FrameSink {
  target(frame: FrameHead): Uint8Array | null
  end(frame: FrameHead, filled: Uint8Array | null): void
}

export function protocolError(message: string): RdmaError {
  return new RdmaError(message, { code: 'ERR_TRANSFER_PROTOCOL' })
}

/** Parses the byte stream into frames; throws ERR_TRANSFER_PROTOCOL on a header no agent sends. */
export class FrameReader {
  readonly #head = Buffer.alloc(HEADER)
  #have = 0
  #frame: FrameHead | undefined
  #target: Uint8Array | null = null
  #pos = 0

  constructor(readonly sink: FrameSink) {}

  push(chunk: Buffer): void {
    let at = 0
    while (at < chunk.length) {
      if (!this.#frame) {
        const take = Math.min(HEADER - this.#have, chunk.length - at)
        chunk.copy(this.#head, this.#have, at, at + take)
        this.#have += take
        at += take
        if (this.#have < HEADER) return
        this.#have = 0
        this.#begin()
        continue
      }
      const frame = this.#frame
      const take = Math.min(frame.payload - this.#pos, chunk.length - at)
      if (this.#target) this.#target.set(chunk.subarray(at, at + take), this.#pos)
      this.#pos += take
      at += take
      if (this.#pos === frame.payload) this.#finish()
    }
  }

  #begin(): void {
    const h = this.#head
    const frame: FrameHead = {
      payload: h.readUInt32LE(0), type: h[4]!, status: h[5]!, batch: h.readUInt32LE(8), key: h.readUInt32LE(12),
      offset: h.readDoubleLE(16), length: h.readUInt32LE(24),
    }
    if (frame.type < FrameType.Control || frame.type > FrameType.ReadAck) throw protocolError(`The peer sent a frame of unknown type ${frame.type}`)
    if (frame.type === FrameType.Control && frame.payload > MAX_CONTROL_BYTES) throw protocolError(`The peer sent a control message of ${frame.payload} bytes (at most ${MAX_CONTROL_BYTES})`)
    this.#frame = frame
    this.#pos = 0
    this.#target = frame.type === FrameType.Control ? Buffer.allocUnsafe(frame.payload) : this.sink.target(frame)
    if (this.#target && this.#target.byteLength !== frame.payload) throw protocolError('A frame\'s payload does not fit where it goes')
    if (frame.payload === 0) this.#finish()
  }

  #finish(): void {
    const frame = this.#frame!
    const target = this.#target
    this.#frame = undefined
    this.#target = null
    this.sink.end(frame, target)
  }
}
