// The TCP link's wire: length-prefixed frames, each a 16-byte header and a
// payload. A batch of slices is one frame: a table of its slices (16 bytes
// each), then (writes) their bytes. The bytes are read straight into where
// they belong (a segment's bytes, a read's destination): one copy from the
// socket's chunk, none to assemble them first.
//
// header:  u32 payload bytes | u8 type | u8 status | u16 0 | u32 batch | u32 slices
// slice:   u32 segment key | u32 length | f64 offset
import { RdmaError } from '../../core/errors.js'

export const HEADER = 16
export const SLICE = 16

export const FrameType = {
  /** A JSON control message (the payload). */
  Control: 1,
  /** A write batch: the slice table, then the slices' bytes in order. Answered by WriteAck. */
  WriteBatch: 2,
  /** status 0: every slice placed; else why the batch was refused (nothing of it placed). */
  WriteAck: 3,
  /** A read batch: the slice table. Answered by ReadData, or ReadAck with the refusal. */
  ReadBatch: 4,
  /** The read batch's bytes, its slices in order. */
  ReadData: 5,
  ReadAck: 6,
} as const

/** Why a peer refused a batch (0: it did not). */
export const Refusal = { None: 0, Unknown: 1, Rights: 2, Bounds: 3 } as const

/** Largest control message accepted (JSON). */
export const MAX_CONTROL_BYTES = 1 << 20
/** Most slices in one batch frame (a batch is at most a send queue's depth). */
export const MAX_SLICES = 1 << 16

export interface FrameHead {
  payload: number
  type: number
  status: number
  batch: number
  slices: number
}

export function writeHead(into: Buffer, at: number, type: number, status: number, batch: number, slices: number, payload: number): void {
  into.writeUInt32LE(payload, at)
  into[at + 4] = type
  into[at + 5] = status
  into.writeUInt16LE(0, at + 6)
  into.writeUInt32LE(batch >>> 0, at + 8)
  into.writeUInt32LE(slices >>> 0, at + 12)
}

export function head(type: number, status: number, batch: number, slices: number, payload: number): Buffer {
  const b = Buffer.allocUnsafe(HEADER)
  writeHead(b, 0, type, status, batch, slices, payload)
  return b
}

export function writeSlice(into: Buffer, at: number, key: number, length: number, offset: number): void {
  into.writeUInt32LE(key >>> 0, at)
  into.writeUInt32LE(length >>> 0, at + 4)
  into.writeDoubleLE(offset, at + 8)
}

/** Where the bytes after a frame's table go: `count` runs of (array, offset, length), in order; `skip` drops them. */
export interface Placement { arrays: Uint8Array[]; offsets: number[]; lengths: number[]; skip: boolean }

/**
 * A frame's receiver. `place` is asked where the bytes after the table go
 * (frames with bytes: WriteBatch, ReadData); `end` follows once the frame is
 * in, with its table (or the whole payload of a control message). The frame
 * object is the reader's, reused for the next frame: keep none of it.
 */
export interface FrameSink {
  place(frame: FrameHead, table: Buffer): Placement
  end(frame: FrameHead, table: Buffer): void
}

export function protocolError(message: string): RdmaError {
  return new RdmaError(message, { code: 'ERR_TRANSFER_PROTOCOL' })
}

const EMPTY = Buffer.alloc(0)

/** Parses the byte stream into frames; throws ERR_TRANSFER_PROTOCOL on a frame no agent sends. */
export class FrameReader {
  readonly #head = Buffer.alloc(HEADER)
  #have = 0
  readonly #frame: FrameHead = { payload: 0, type: 0, status: 0, batch: 0, slices: 0 }
  /** 0: header; 1: table (or control payload); 2: bytes. */
  #state = 0
  #table: Buffer = EMPTY
  #tableHave = 0
  #place: Placement | undefined
  #run = 0
  #runPos = 0
  #bytesLeft = 0

  constructor(readonly sink: FrameSink) {}

  push(chunk: Buffer): void {
    let at = 0
    while (at < chunk.length) {
      if (this.#state === 0) {
        const take = Math.min(HEADER - this.#have, chunk.length - at)
        chunk.copy(this.#head, this.#have, at, at + take)
        this.#have += take
        at += take
        if (this.#have < HEADER) return
        this.#have = 0
        this.#begin()
      } else if (this.#state === 1) {
        const take = Math.min(this.#table.length - this.#tableHave, chunk.length - at)
        chunk.copy(this.#table, this.#tableHave, at, at + take)
        this.#tableHave += take
        at += take
        if (this.#tableHave === this.#table.length) this.#tableDone()
      } else {
        at = this.#bytes(chunk, at)
      }
    }
  }

  #begin(): void {
    const h = this.#head
    const frame = this.#frame
    frame.payload = h.readUInt32LE(0)
    frame.type = h[4]!
    frame.status = h[5]!
    frame.batch = h.readUInt32LE(8)
    frame.slices = h.readUInt32LE(12)
    let table: number
    switch (frame.type) {
      case FrameType.Control:
        if (frame.payload > MAX_CONTROL_BYTES) throw protocolError(`The peer sent a control message of ${frame.payload} bytes (at most ${MAX_CONTROL_BYTES})`)
        table = frame.payload
        break
      case FrameType.WriteBatch:
      case FrameType.ReadBatch:
        if (frame.slices < 1 || frame.slices > MAX_SLICES) throw protocolError(`The peer sent a batch of ${frame.slices} slices`)
        table = frame.slices * SLICE
        if (table > frame.payload || (frame.type === FrameType.ReadBatch && table !== frame.payload)) throw protocolError('The peer sent a batch frame of the wrong length')
        break
      case FrameType.ReadData:
        table = 0
        break
      case FrameType.WriteAck:
      case FrameType.ReadAck:
        if (frame.payload !== 0) throw protocolError('The peer sent an ack with a payload')
        table = 0
        break
      default:
        throw protocolError(`The peer sent a frame of unknown type ${frame.type}`)
    }
    this.#table = table === 0 ? EMPTY : Buffer.allocUnsafe(table)
    this.#tableHave = 0
    this.#state = 1
    if (table === 0) this.#tableDone()
  }

  #tableDone(): void {
    const frame = this.#frame
    this.#bytesLeft = frame.payload - this.#table.length
    if (this.#bytesLeft === 0) return this.#finish()
    const place = this.sink.place(frame, this.#table)
    let sum = 0
    for (const len of place.lengths) sum += len
    if (sum !== this.#bytesLeft) throw protocolError(`A frame's ${this.#bytesLeft} bytes do not match its ${sum} bytes of slices`)
    this.#place = place
    this.#run = 0
    this.#runPos = 0
    this.#state = 2
  }

  #bytes(chunk: Buffer, at: number): number {
    const place = this.#place!
    while (at < chunk.length && this.#bytesLeft > 0) {
      const len = place.lengths[this.#run]!
      const take = Math.min(len - this.#runPos, chunk.length - at)
      // The one copy: from the socket's chunk into its place (no view allocated).
      if (!place.skip) chunk.copy(place.arrays[this.#run]!, place.offsets[this.#run]! + this.#runPos, at, at + take)
      this.#runPos += take
      this.#bytesLeft -= take
      at += take
      if (this.#runPos === len) { this.#run++; this.#runPos = 0 }
    }
    if (this.#bytesLeft === 0) this.#finish()
    return at
  }

  #finish(): void {
    const table = this.#table
    this.#state = 0
    this.#place = undefined
    this.#table = EMPTY
    this.sink.end(this.#frame, table)
  }
}
