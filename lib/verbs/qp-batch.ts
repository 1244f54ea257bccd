// Batches of work requests through a QP: postBatch() (checked operations of
// every kind, posted with one native call) with its hot path for plain
// writes and reads, and postEncoded() for the transfer engine's columns.
import { RdmaError } from '../core/errors.js'
import { SendFlags, WrOpcode } from '../core/constants.js'
import { NO_OPTIONS, object, oneOf, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { splitWr } from '../ops/split.js'
import type { WorkRequestEncoder } from '../ops/encoder.js'
import { LocalSlice, type MemoryRegion } from './memory.js'
import { RemoteSlice } from './remote.js'
import { wrongPd } from './local-sges.js'
import { batchAtomicWr, isU32, opNameOf, sendWr, type QpContext } from './work-requests.js'
import type { BatchOperation, BatchOptions } from './queue-pair-options.js'

const noResult = (): undefined => undefined

/**
 * Posts many work requests with one native call (one doorbell). With
 * completions 'last' only the final request is signaled; the promise
 * resolves when all have completed, or rejects with the first failure.
 */
export function postBatch(qp: QpContext, operations: readonly BatchOperation[], options: BatchOptions = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    try {
      if (!Array.isArray(operations) || operations.length === 0) throw typeError('a non-empty array of operations', 'operations', operations)
      const o = options === NO_OPTIONS ? NO_OPTIONS : optionalObject(options, 'options')
      const wait = o === NO_OPTIONS ? NO_OPTIONS : waitOptions(o)
      const mode = o.completions === undefined ? 'last' : oneOf(o.completions, 'options.completions', ['last', 'each'] as const, 'last')
      const baseFlags = (o.fence ? SendFlags.Fence : 0) | (o.solicited ? SendFlags.Solicited : 0)
      if (simpleBatch(qp, operations, wait, mode, baseFlags, resolve, reject)) return
      const wrs = operations.map((op, i) => {
        // Argument names are only built when a check fails.
        const record = typeof op === 'object' && op !== null && !Array.isArray(op) ? op as unknown as Record<string, unknown> : object(op, opNameOf(i))
        const kind = record.op === 'write' || record.op === 'read' || record.op === 'send' || record.op === 'compareAndSwap' || record.op === 'fetchAndAdd' ? record.op
          : oneOf(record.op, `${opNameOf(i)}.op`, ['write', 'read', 'send', 'compareAndSwap', 'fetchAndAdd'] as const)
        if (kind === 'compareAndSwap' || kind === 'fetchAndAdd') return batchAtomicWr(qp, kind, record, i, baseFlags)
        return sendWr(qp, kind, record.local, record.remote, record, i, baseFlags)
      })
      const regions = wrs.flatMap((w) => w.regions)
      // Writes and reads over the max message size become several requests.
      const requests = wrs.flatMap(({ wr, length }) => length > qp.maxMessage && qp.overMaxMessage(length) ? splitWr(wr, length, qp.maxMessage) : [wr])
      const verb = operations.length === 1 ? operations[0]!.op : 'batch'
      // 'each' signals every request (one completion each); the promise
      // still settles once, on the last completion or the first failure.
      qp.queues.submit('send', verb, requests.length, regions, wait, resolve, reject, noResult, (first, enc) => {
        requests.forEach((wr, i) => {
          const signaled = mode === 'each' || i === requests.length - 1
          wr.wrId = first + i
          if (signaled) wr.flags |= SendFlags.Signaled
          enc.addSend(wr)
        })
      })
    } catch (error) {
      reject(error)
    }
  })
}

/**
 * The hot path of postBatch(): every operation one slice, not empty nor over
 * the max message size, with no inline data: a write or read (a write may
 * carry immediate data), or a send on a connected QP (with or without
 * immediate data). Each is checked as sendWr() checks it, and the batch is
 * encoded straight into the send buffer by one call (no work request
 * objects). Each distinct region is held once. Returns false (nothing done)
 * when an operation is not that simple or fails a check: the general path
 * then says why.
 */
function simpleBatch(qp: QpContext, operations: readonly BatchOperation[], wait: WaitOptions, mode: 'last' | 'each', baseFlags: number,
  resolve: () => void, reject: (error: Error) => void): boolean {
  const n = operations.length
  const locals: LocalSlice[] = new Array(n)
  const remotes: Array<RemoteSlice | undefined> = new Array(n)
  const opcodes: number[] = new Array(n)
  const imms: number[] = new Array(n)
  const maxMessage = qp.maxMessage
  const readable = qp.type === 'RC'
  const connected = qp.type !== 'UD'
  // The distinct regions, held once each: a batch usually names one.
  let firstRegion: MemoryRegion | undefined
  let regions: MemoryRegion[] | undefined
  for (let i = 0; i < n; i++) {
    const op = operations[i] as { op?: unknown; local?: unknown; remote?: unknown; immediate?: unknown; inline?: unknown; invalidateRkey?: unknown }
    if (typeof op !== 'object' || op === null) return false
    const local = op.local
    const imm = op.immediate
    if (!(local instanceof LocalSlice) || !connected || (op.inline !== undefined && op.inline !== false) || (imm !== undefined && !isU32(imm))) return false
    const length = local.length
    if (length === 0 || length > maxMessage) return false
    const kind = op.op
    if (kind === 'send') {
      if (op.invalidateRkey !== undefined) return false
      opcodes[i] = imm === undefined ? WrOpcode.Send : WrOpcode.SendWithImm
    } else {
      const remote = op.remote
      if (!(remote instanceof RemoteSlice) || remote.length !== length) return false
      if (kind === 'write') opcodes[i] = imm === undefined ? WrOpcode.RdmaWrite : WrOpcode.RdmaWriteWithImm
      else if (kind === 'read' && readable && imm === undefined) opcodes[i] = WrOpcode.RdmaRead
      else return false
      remotes[i] = remote
    }
    const region = local.region
    if (region !== firstRegion) {
      if (region.pd !== qp.pd || !region.usable) return false // the general path says why
      if (firstRegion === undefined) firstRegion = region
      else if (regions === undefined) regions = [firstRegion, region]
      else if (!regions.includes(region)) regions.push(region)
    }
    locals[i] = local
    imms[i] = imm === undefined ? 0 : imm as number
  }
  const verb = n === 1 ? operations[0]!.op as 'write' | 'read' | 'send' : 'batch'
  const signalEach = mode === 'each'
  qp.queues.submit('send', verb, n, regions ?? firstRegion!, wait, resolve, reject, noResult,
    (first, enc) => enc.addSliceColumns(first, n, locals, remotes, opcodes, imms, baseFlags, signalEach))
  return true
}

/**
 * @internal The transfer engine's hot path: `count` RDMA WRITEs (or READs)
 * in one post, written by `encode(firstWrId, encoder)` with one
 * `encoder.addOne()` each (only the last signaled), straight from the
 * caller's columns: no operation or slice objects. The caller checked every
 * request once, when it planned them: within its regions (local and remote),
 * at most the max message size. Here each local region in `regions` (those
 * the requests name) is checked to be of this PD and usable; they are held
 * until the batch completes.
 */
export function postEncoded(qp: QpContext, verb: 'write' | 'read' | 'send', count: number, regions: readonly MemoryRegion[],
  encode: (firstWrId: number, enc: WorkRequestEncoder) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    try {
      if (verb === 'read' && qp.type !== 'RC') throw new RdmaError('read needs an RC QP', { code: 'ERR_QP_TYPE' })
      for (const region of regions) {
        if (region.pd !== qp.pd) throw wrongPd('regions')
        region.assertUsable()
      }
      qp.queues.submit('send', count === 1 ? verb : 'batch', count, regions, NO_OPTIONS, resolve, reject, noResult, encode)
    } catch (error) {
      reject(error)
    }
  })
}
