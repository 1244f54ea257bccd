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

export class QpLane implements Lane {
  /** `index`: the QP's place in its link (a per-peer grant has an rkey per QP); `rail`: its device (rails.ts). */
  constructor(readonly qp: QueuePair, readonly index: number, readonly rail = 0) {}

  /** Slices in flight; one send slot more is kept for a notice (rdma-link.ts sizes the QP so). */
  get depth(): number { return this.qp.caps.maxSendWr - 1 }
  get broken(): boolean { return this.qp.closed || this.qp.error !== undefined }

  post(plan: CheckedPlan, from: number, to: number, regions: readonly SegmentMemory[], tail?: NoticeTail): Promise<void> {
    const { slices, wire } = plan
    const opcode = plan.op === 'read' ? WrOpcode.RdmaRead : WrOpcode.RdmaWrite
    const count = to - from
    // An RDMA agent's segments are all memory regions of its PD (rdma-transport.ts).
    const held = tail?.slot ? [...regions as MemoryRegion[], tail.slot.region] : regions as MemoryRegion[]
    return this.qp.postEncoded(plan.op, tail ? count + 1 : count, held, (first, enc) => {
      const last = tail ? -1 : to - 1
      if (this.rail > 0) {
        // Another rail: the local memory as that rail's device registered it, and the peer's key on this lane's rail.
        const { locals, remotes } = plan
        const rail = this.rail
        for (let i = from; i < to; i++) {
          const keys = remotes[slices.rseg[i]!]!.laneKeys
          enc.addOne(first + i - from, opcode, i === last ? SendFlags.Signaled : 0, wire.laddr[i]!, slices.len[i]!, (locals[slices.lseg[i]!]!.regionOn(rail) as MemoryRegion).lkey,
            wire.raddrLo[i]!, wire.raddrHi[i]!, keys === undefined ? wire.rkey[i]! : keys[this.index]!, 0)
        }
      } else if (wire.keyed) {
        // Per-peer grants: each segment's window on this QP (another QP's window refuses it).
        const remotes = plan.remotes
        for (let i = from; i < to; i++) {
          const keys = remotes[slices.rseg[i]!]!.laneKeys
          enc.addOne(first + i - from, opcode, i === last ? SendFlags.Signaled : 0, wire.laddr[i]!, slices.len[i]!, wire.lkey[i]!,
            wire.raddrLo[i]!, wire.raddrHi[i]!, keys === undefined ? wire.rkey[i]! : keys[this.index]!, 0)
        }
      } else {
        for (let i = from; i < to; i++) {
          enc.addOne(first + i - from, opcode, i === last ? SendFlags.Signaled : 0, wire.laddr[i]!, slices.len[i]!, wire.lkey[i]!,
            wire.raddrLo[i]!, wire.raddrHi[i]!, wire.rkey[i]!, 0)
        }
      }
      if (tail) encodeTail(enc, first + count, tail)
    })
  }

  /** A notice alone (a read's, notify()'s, or a skip). */
  postNotice(tail: NoticeTail): Promise<void> {
    return this.qp.postEncoded('send', 1, tail.slot ? [tail.slot.region] : [], (first, enc) => encodeTail(enc, first, tail))
  }

  close(): void { this.qp.close() }
}
