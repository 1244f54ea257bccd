// The work requests of a QP's operations, checked and built: every argument
// of a write, read, send or atomic, in the documented order; and why a tagged
// post is refused. The QP (queue-pair.ts) calls these; the queues
// (ops/qp-queues.ts) post what they build.
import { closedError, RdmaError } from '../core/errors.js'
import { SendFlags, WrOpcode, type QpTypeName } from '../core/constants.js'
import { boolean, instance, integer, object, rangeError, typeError, uint64 } from '../core/validate.js'
import type { SendWr, Sge } from '../ops/encoder.js'
import type { QpQueues } from '../ops/qp-queues.js'
import { TAGGED_FETCH_ADD, TAGGED_VERBS, TAGGED_WRITE } from '../ops/tagged-ops.js'
import { AddressHandle } from './address-handle.js'
import { LocalSlice, type MemoryRegion } from './memory.js'
import { RemoteSlice } from './remote.js'
import { localSges, wrongPd } from './local-sges.js'
import type { ProtectionDomain } from './protection-domain.js'
import type { AtomicSlotPool } from './atomic-slots.js'
import type { NativeQueuePair } from '../native/addon.js'

/** What building a QP's requests needs of it (a context the QP makes once: not methods a user could call). */
export interface QpContext {
  readonly pd: ProtectionDomain
  readonly type: QpTypeName
  readonly qpn: number
  readonly caps: { maxSendSge: number; maxInlineData: number }
  readonly handle: NativeQueuePair
  /** The PD's library-owned atomic result slots. */
  readonly atomicSlots: AtomicSlotPool
  /** @internal (its type names regions' module-private members) */
  readonly queues: QpQueues<LocalSlice>
  /** Bytes one work request may move (the port's max message size); 0 until first asked. */
  readonly maxMessage: number
  /** Whether `length` is over the port's max message size (asked once). */
  overMaxMessage(length: number): boolean
  assertOpen(): void
}

/** Argument names for messages: index -1 is a single operation, else operations[index]. */
export const opNameOf = (index: number): string => index < 0 ? 'options' : `operations[${index}]`
const localNameOf = (index: number): string => index < 0 ? 'local' : `operations[${index}].local`

export const isU32 = (value: unknown): boolean => typeof value === 'number' && value >>> 0 === value

/**
 * Validates one write/read/send and builds its work request. Hot path:
 * argument names for messages are only built when a check fails.
 */
export function sendWr(qp: QpContext, kind: 'write' | 'read' | 'send', local: unknown, remote: unknown, o: Record<string, unknown>, index: number, baseFlags: number): { wr: SendWr; regions: MemoryRegion | MemoryRegion[]; length: number } {
  let sges: Sge[]
  let regions: MemoryRegion | MemoryRegion[]
  let length: number
  if (local instanceof LocalSlice) { // the common case: one slice
    const region = local.region
    region.assertUsable()
    if (region.pd !== qp.pd) throw wrongPd(localNameOf(index))
    length = local.length
    sges = length > 0 ? [{ address: region.address + local.offset, length, lkey: region.lkey }] : []
    regions = region
  } else {
    ({ sges, regions, length } = localSges(local, localNameOf(index), qp.caps.maxSendSge, qp.pd))
  }
  let flags = baseFlags
  if (o.inline !== undefined && o.inline !== false) {
    boolean(o.inline, `${opNameOf(index)}.inline`, false)
    if (kind === 'read') throw typeError('no inline flag on a read', `${opNameOf(index)}.inline`, true)
    if (length > qp.caps.maxInlineData) throw rangeError(`at most ${qp.caps.maxInlineData} bytes inline (maxInlineData)`, localNameOf(index), length)
    // Inline data is copied by the CPU from the address: a dma-buf's iova is not one.
    if (Array.isArray(regions) ? regions.some((r) => r.dmabuf) : regions.dmabuf) throw typeError('memory the CPU can read (not a dma-buf region) for inline data', `${opNameOf(index)}.inline`, true)
    flags |= SendFlags.Inline
  }
  const imm = o.immediate
  if (imm !== undefined && !isU32(imm)) integer(imm, `${opNameOf(index)}.immediate`, 0, 0xffffffff)
  const wr: SendWr = { wrId: 0, opcode: 0, flags, sges }
  if (kind === 'send') {
    wr.opcode = imm === undefined ? WrOpcode.Send : WrOpcode.SendWithImm
    if (imm !== undefined) wr.immOrRkey = imm as number
    if (o.invalidateRkey !== undefined) {
      if (imm !== undefined) throw typeError('either immediate or invalidateRkey', opNameOf(index), o)
      wr.opcode = WrOpcode.SendWithInv
      wr.immOrRkey = integer(o.invalidateRkey, `${opNameOf(index)}.invalidateRkey`, 0, 0xffffffff)
    }
    if (length > qp.maxMessage && qp.overMaxMessage(length)) { // a message cannot be split
      throw new RdmaError(`Cannot send ${length} bytes: a message holds at most ${qp.maxMessage} (the port's max message size)`, { code: 'ERR_MESSAGE_TOO_LARGE', verb: kind, qpn: qp.qpn })
    }
    if (qp.type === 'UD') {
      const dest = object(o.dest, `${opNameOf(index)}.dest`)
      const ah = instance(dest.ah, `${opNameOf(index)}.dest.ah`, AddressHandle)
      // Checked now: found while posting a gathered batch, it would fail the wrong request.
      if (ah.closed) throw closedError('AddressHandle')
      wr.ahId = ah.id
      wr.remoteQpn = integer(dest.qpn, `${opNameOf(index)}.dest.qpn`, 0, 0xffffff)
      wr.remoteQkey = integer(dest.qkey, `${opNameOf(index)}.dest.qkey`, 0, 0xffffffff)
    }
  } else {
    if (qp.type === 'UD') throw new RdmaError(`${kind} needs a connected QP (RC or UC)`, { code: 'ERR_QP_TYPE' })
    if (kind === 'read' && qp.type !== 'RC') throw new RdmaError('read needs an RC QP', { code: 'ERR_QP_TYPE' })
    if (!(remote instanceof RemoteSlice)) throw typeError('a RemoteSlice (remoteRegion(desc).slice())', index < 0 ? 'remote' : `${opNameOf(index)}.remote`, remote)
    if (remote.length !== length) throw rangeError(`a remote slice of ${length} bytes (the local length)`, index < 0 ? 'remote.length' : `${opNameOf(index)}.remote.length`, remote.length)
    wr.remoteHi = remote.addrHi
    wr.remoteLo = remote.addrLo
    wr.rkey = remote.rkey
    if (kind === 'read') {
      if (imm !== undefined) throw typeError('no immediate on a read', `${opNameOf(index)}.immediate`, imm)
      wr.opcode = WrOpcode.RdmaRead
    } else {
      wr.opcode = imm === undefined ? WrOpcode.RdmaWrite : WrOpcode.RdmaWriteWithImm
      if (imm !== undefined) wr.immOrRkey = imm as number
    }
  }
  return { wr, regions, length }
}

/** An atomic of a batch: its old value lands in `local` (8 bytes of a region of this PD). */
export function batchAtomicWr(qp: QpContext, kind: 'compareAndSwap' | 'fetchAndAdd', record: Record<string, unknown>, index: number, baseFlags: number): { wr: SendWr; regions: MemoryRegion; length: number } {
  const name = opNameOf(index)
  if (qp.type !== 'RC') throw new RdmaError(`${kind} needs an RC QP`, { code: 'ERR_QP_TYPE' })
  const local = instance(record.local, `${name}.local`, LocalSlice)
  if (local.length !== 8) throw rangeError('a local slice of 8 bytes', `${name}.local.length`, local.length)
  local.region.assertUsable()
  if (local.region.pd !== qp.pd) throw wrongPd(`${name}.local`)
  const remote = record.remote
  if (!(remote instanceof RemoteSlice)) throw typeError('a RemoteSlice', `${name}.remote`, remote)
  if (remote.length !== 8) throw rangeError('a remote slice of 8 bytes', `${name}.remote.length`, remote.length)
  const compareAdd = kind === 'compareAndSwap' ? uint64(record.compare, `${name}.compare`) : uint64(record.add, `${name}.add`)
  const swap = kind === 'compareAndSwap' ? uint64(record.swap, `${name}.swap`) : 0n
  const wr: SendWr = {
    wrId: 0, opcode: kind === 'compareAndSwap' ? WrOpcode.AtomicCmpAndSwp : WrOpcode.AtomicFetchAndAdd, flags: baseFlags,
    sges: [{ address: local.address, length: 8, lkey: local.lkey }], remoteHi: remote.addrHi, remoteLo: remote.addrLo, rkey: remote.rkey, compareAdd, swap,
  }
  return { wr, regions: local.region, length: 8 }
}

/**
 * Why a tagged post's arguments (or the QP) refuse it, in the order the
 * checks are documented; out of line, so that the hot path stays small
 * enough for V8 to inline what it calls.
 */
export function taggedArgumentError(qp: QpContext, verbIndex: number, local: unknown, remote: unknown, tag: unknown): Error {
  const verb = TAGGED_VERBS[verbIndex]!
  if (qp.queues.tagged === undefined) {
    qp.assertOpen()
    return new RdmaError(`Cannot post a tagged ${verb}: set a completion handler first (qp.setCompletionHandler())`, { code: 'ERR_NO_HANDLER', verb, qpn: qp.qpn })
  }
  if (!(local instanceof LocalSlice)) return typeError('a LocalSlice (region.slice())', 'local', local)
  if (!(remote instanceof RemoteSlice)) return typeError('a RemoteSlice (remoteRegion(desc).slice())', 'remote', remote)
  try {
    integer(tag, 'tag', 0, 0xffffffff)
  } catch (error) {
    return error as Error
  }
  const length = local.length
  if (verbIndex >= TAGGED_FETCH_ADD) {
    if (length !== 8) return rangeError('a local slice of 8 bytes', 'local.length', length)
    if (remote.length !== 8) return rangeError('a remote slice of 8 bytes', 'remote.length', remote.length)
  } else if (remote.length !== length) {
    return rangeError(`a remote slice of ${length} bytes (the local length)`, 'remote.length', remote.length)
  }
  if (verbIndex === TAGGED_WRITE ? qp.type === 'UD' : qp.type !== 'RC') {
    return new RdmaError(`${verb} needs ${verbIndex === TAGGED_WRITE ? 'a connected QP (RC or UC)' : 'an RC QP'}`, { code: 'ERR_QP_TYPE', verb, qpn: qp.qpn })
  }
  if (length > qp.maxMessage) {
    return new RdmaError(`Cannot ${verb} ${length} bytes in one tagged request: at most ${qp.maxMessage} (the port's max message size); qp.${verb}() splits`, { code: 'ERR_MESSAGE_TOO_LARGE', verb, qpn: qp.qpn })
  }
  return new Error(`internal: no reason found to refuse a tagged ${verb}`) // a check above and the hot path disagree
}
