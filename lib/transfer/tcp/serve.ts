// The receiving side of a TCP link's data frames: the agent's code, not a
// NIC, enforces its segments here. Every slice of a batch is checked before
// any byte of it is placed: a write lands only in segments registered now
// that allow 'write' and hold the whole range; a read is answered only from
// segments that allow 'read'. A batch with one refused slice is refused as a
// whole (its bytes are read and dropped, nothing is placed or sent), and the
// ack says why.
import type { PlainMemory } from '../plain-memory.js'
import { allows } from '../segments.js'
import { FrameType, head, HEADER, Refusal, SLICE, writeHead, type FrameHead, type Placement } from './frames.js'

/** The agent's plain segments by key (only those registered now). */
export type SegmentLookup = (key: number) => PlainMemory | undefined

export class SegmentServer {
  /** The last write batch's verdict (placed, or refused and why), for its ack. */
  #refusal: number = Refusal.None

  constructor(readonly lookup: SegmentLookup, readonly send: (part: Uint8Array) => void) {}

  /** Checks a batch's table for `op`: the segments' bytes by slice, or the refusal. */
  #check(table: Buffer, count: number, op: 'read' | 'write'): Placement | number {
    const arrays: Uint8Array[] = new Array(count)
    const offsets: number[] = new Array(count)
    const lengths: number[] = new Array(count)
    let last: PlainMemory | undefined
    let lastKey = -1
    for (let i = 0, at = 0; i < count; i++, at += SLICE) {
      const key = table.readUInt32LE(at)
      const length = table.readUInt32LE(at + 4)
      const offset = table.readDoubleLE(at + 8)
      if (key !== lastKey) {
        lastKey = key
        last = this.lookup(key)
        if (!last || !last.open) return Refusal.Unknown
        if (!allows(last.rights, op)) return Refusal.Rights
      }
      if (!Number.isInteger(offset) || offset < 0 || length === 0 || offset + length > last!.length) return Refusal.Bounds
      arrays[i] = last!.bytes
      offsets[i] = offset
      lengths[i] = length
    }
    return { arrays, offsets, lengths, skip: false }
  }

  /** Where a write batch's bytes land (all checked first), or a placement that drops them. */
  placeWrite(frame: FrameHead, table: Buffer): Placement {
    const checked = this.#check(table, frame.slices, 'write')
    if (typeof checked === 'number') {
      this.#refusal = checked
      return { arrays: [], offsets: [], lengths: [frame.payload - table.length], skip: true }
    }
    this.#refusal = Refusal.None
    return checked
  }

  /** The write batch is in (placed, or dropped): its ack. */
  writeDone(frame: FrameHead): void {
    this.send(head(FrameType.WriteAck, this.#refusal, frame.batch, 0, 0))
    this.#refusal = Refusal.None
  }

  /** Answers a read batch with its bytes (views of the segments: no copy), or with the refusal. */
  read(frame: FrameHead, table: Buffer): void {
    const checked = this.#check(table, frame.slices, 'read')
    if (typeof checked === 'number') return this.send(head(FrameType.ReadAck, checked, frame.batch, 0, 0))
    let bytes = 0
    for (const len of checked.lengths) bytes += len
    const h = Buffer.allocUnsafe(HEADER)
    writeHead(h, 0, FrameType.ReadData, 0, frame.batch, frame.slices, bytes)
    this.send(h)
    for (let i = 0; i < frame.slices; i++) this.send(checked.arrays[i]!.subarray(checked.offsets[i]!, checked.offsets[i]! + checked.lengths[i]!))
  }
}
