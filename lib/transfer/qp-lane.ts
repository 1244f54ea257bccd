// The RDMA lane: a poster's batches as work requests on one data RC QP,
// encoded straight from the plan's columns (one postBatch, one doorbell and
// one signaled completion per batch). A batch may end with a notice
// (notices.ts): the SEND_WITH_IMM is then the signaled request.
import { SendFlags, WrOpcode } from '../core/constants.js'
import type { MemoryRegion } from '../verbs/memory.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import { encodeTail, type NoticeTail } from './notices.js'
import type { CheckedPlan } from './plan.js'
import type { Lane } from './poster.js'
import type { SegmentMemory } from './segments.js'

const TWO_32 = 2 ** 32

/** What encodeSlices() writes to: a QP's work request encoder (ops/encoder.ts). */
export interface SliceEncoder {
  addOne(wrId: number, opcode: number, flags: number, address: number, length: number, lkey: number, remoteLo: number, remoteHi: number, rkey: number, imm: number): number
}

/**
 * Slices from .. to of `plan` as RDMA WRITEs (READs), work request ids from
 * `first`, for data QP `lane` on rail `rail`: a slice's addresses are its
 * segments' plus its offsets (the remote one split into 32-bit halves), the
 * keys its segments': the rail's registration here, and there the lane's
 * own key where the segment is a per-peer grant or on several rails
 * (RemoteSegment.laneKeys). Segments are read again only where they change
 * (consecutive slices usually share them): computed at posting, nothing per
 * slice is kept in the plan. `signalLast`: the last request is signaled
 * (else a notice after it is).
 */
export function encodeSlices(enc: SliceEncoder, first: number, plan: CheckedPlan, from: number, to: number, rail: number, lane: number, signalLast: boolean): void {
  const { slices, locals, remotes } = plan
  const opcode = plan.op === 'read' ? WrOpcode.RdmaRead : WrOpcode.RdmaWrite
  const last = signalLast ? to - 1 : -1
  let l = -1
  let localAddress = 0
  let lkey = 0
  let r = -1
  let remoteLo = 0
  let remoteHi = 0
  let rkey = 0
  for (let i = from; i < to; i++) {
    if (slices.lseg[i] !== l) {
      l = slices.lseg[i]!
      // An RDMA agent's segments are all memory regions (rdma-transport.ts).
      const region = locals[l]!.regionOn(rail) as MemoryRegion
      localAddress = region.address
      lkey = region.lkey
    }
    if (slices.rseg[i] !== r) {
      r = slices.rseg[i]!
      const segment = remotes[r]!
      remoteLo = segment.region.addrLo
      remoteHi = segment.region.addrHi
      rkey = segment.laneKeys === undefined ? segment.region.rkey : segment.laneKeys[lane]!
    }
    const lo = remoteLo + slices.roff[i]!
    // lo mod 2^32 (an integer below 2^53): a double's % is a call to fmod.
    enc.addOne(first + i - from, opcode, i === last ? SendFlags.Signaled : 0, localAddress + slices.loff[i]!, slices.len[i]!, lkey,
      lo >>> 0, (remoteHi + Math.floor(lo / TWO_32)) >>> 0, rkey, 0)
  }
}

export class QpLane implements Lane {
  /** `index`: the QP's place in its link (a per-peer grant has an rkey per QP); `rail`: its device (rails.ts). */
  constructor(readonly qp: QueuePair, readonly index: number, readonly rail = 0) {}

  /** Slices in flight; one send slot more is kept for a notice (rdma-link.ts sizes the QP so). */
  get depth(): number { return this.qp.caps.maxSendWr - 1 }
  get broken(): boolean { return this.qp.closed || this.qp.error !== undefined }

  post(plan: CheckedPlan, from: number, to: number, regions: readonly SegmentMemory[], tail?: NoticeTail): Promise<void> {
    const count = to - from
    // An RDMA agent's segments are all memory regions of its PD (rdma-transport.ts).
    const held = tail?.slot ? [...regions as MemoryRegion[], tail.slot.region] : regions as MemoryRegion[]
    return this.qp.postEncoded(plan.op, tail ? count + 1 : count, held, (first, enc) => {
      encodeSlices(enc, first, plan, from, to, this.rail, this.index, tail === undefined)
      if (tail) encodeTail(enc, first + count, tail)
    })
  }

  /** A notice alone (a read's, notify()'s, or a skip). */
  postNotice(tail: NoticeTail): Promise<void> {
    return this.qp.postEncoded('send', 1, tail.slot ? [tail.slot.region] : [], (first, enc) => encodeTail(enc, first, tail))
  }

  close(): void { this.qp.close() }
}
