// The receiving side of a TCP link's data frames: the agent's code, not a
// NIC, enforces its segments here. A write lands only in a segment that is
// registered now, allows 'write', and holds the whole range; a read is
// answered only from one that allows 'read'. A refused frame moves nothing
// (a write's bytes are skipped, not placed), the rest of its batch is refused
// too, and the batch's ack says why.
import type { PlainMemory } from '../plain-memory.js'
import { allows } from '../segments.js'
import { FrameType, head, Refusal, type FrameHead } from './frames.js'

/** The agent's plain segments by key (only those registered now). */
export type SegmentLookup = (key: number) => PlainMemory | undefined

export class SegmentServer {
  /** Write batches refused so far (until their WriteEnd), and why. */
  readonly #writes = new Map<number, number>()
  readonly #reads = new Map<number, number>()

  constructor(readonly lookup: SegmentLookup, readonly send: (parts: readonly Uint8Array[]) => void) {}

  #check(frame: FrameHead, op: 'read' | 'write', length: number): { refusal: number; memory: PlainMemory | undefined } {
    const memory = this.lookup(frame.key)
    if (!memory || !memory.open) return { refusal: Refusal.Unknown, memory }
    if (!allows(memory.rights, op)) return { refusal: Refusal.Rights, memory }
    const offset = frame.offset
    if (!Number.isInteger(offset) || offset < 0 || offset + length > memory.length) return { refusal: Refusal.Bounds, memory }
    return { refusal: Refusal.None, memory }
  }

  /** Where a Write frame's payload lands, or null (refused: its bytes are read and dropped). */
  writeTarget(frame: FrameHead): Uint8Array | null {
    if (this.#writes.has(frame.batch)) return null
    const { refusal, memory } = this.#check(frame, 'write', frame.payload)
    if (refusal !== Refusal.None) {
      this.#writes.set(frame.batch, refusal)
      return null
    }
    return memory!.bytes.subarray(frame.offset, frame.offset + frame.payload)
  }

  /** Every Write frame of the batch before it was placed (or refused): the ack says which. */
  writeEnd(frame: FrameHead): void {
    const status = this.#writes.get(frame.batch) ?? Refusal.None
    this.#writes.delete(frame.batch)
    this.send([head(FrameType.WriteAck, status, frame.batch, 0, 0, 0, 0)])
  }

  /** Answers a Read frame with the bytes (a view of the segment: no copy), unless refused. */
  read(frame: FrameHead): void {
    if (this.#reads.has(frame.batch)) return
    const { refusal, memory } = this.#check(frame, 'read', frame.length)
    if (refusal !== Refusal.None) {
      this.#reads.set(frame.batch, refusal)
      return
    }
    this.send([head(FrameType.ReadData, 0, frame.batch, 0, 0, frame.length, frame.length), memory!.bytes.subarray(frame.offset, frame.offset + frame.length)])
  }

  readEnd(frame: FrameHead): void {
    const status = this.#reads.get(frame.batch) ?? Refusal.None
    this.#reads.delete(frame.batch)
    this.send([head(FrameType.ReadAck, status, frame.batch, 0, 0, 0, 0)])
  }
}
