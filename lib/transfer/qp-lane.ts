// The RDMA lane: a poster's batches as work requests on one data RC QP,
// encoded straight from the plan's columns (one postBatch, one doorbell and
// one signaled completion per batch).
import { SendFlags, WrOpcode } from '../core/constants.js'
import type { MemoryRegion } from '../verbs/memory.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { CheckedPlan } from './plan.js'
import type { Lane } from './poster.js'
import type { SegmentMemory } from './segments.js'

export class QpLane implements Lane {
  constructor(readonly qp: QueuePair) {}

  get depth(): number { return this.qp.caps.maxSendWr }
  get broken(): boolean { return this.qp.closed || this.qp.error !== undefined }

  post(plan: CheckedPlan, from: number, to: number, regions: readonly SegmentMemory[]): Promise<void> {
    const { slices, wire } = plan
    const opcode = plan.op === 'read' ? WrOpcode.RdmaRead : WrOpcode.RdmaWrite
    // An RDMA agent's segments are all memory regions of its PD (rdma-transport.ts).
    return this.qp.postEncoded(plan.op, to - from, regions as MemoryRegion[], (first, enc) => {
      const last = to - 1
      for (let i = from; i < to; i++) {
        enc.addOne(first + i - from, opcode, i === last ? SendFlags.Signaled : 0, wire.laddr[i]!, slices.len[i]!, wire.lkey[i]!,
          wire.raddrLo[i]!, wire.raddrHi[i]!, wire.rkey[i]!, 0)
      }
    })
  }

  close(): void { this.qp.close() }
}
