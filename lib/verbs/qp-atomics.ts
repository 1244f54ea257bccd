// Atomics through a QP, the general path: compare-and-swap and fetch-and-add
// with options (a caller's result slot, a timeout, a signal), or when the
// fast path (queue-pair.ts) cannot take them now.
import { SendFlags } from '../core/constants.js'
import { instance, NO_OPTIONS, optionalObject, rangeError, typeError, waitOptions } from '../core/validate.js'
import { smallU64 } from '../core/u64.js'
import type { SendWr } from '../ops/encoder.js'
import { Pending } from '../ops/pending.js'
import { INFLIGHT, RELEASE, type HeldRegion } from '../ops/held-region.js'
import { LocalSlice, readAtomicValue } from './memory.js'
import { RemoteSlice } from './remote.js'
import { wrongPd } from './local-sges.js'
import type { AtomicOptions } from './queue-pair-options.js'
import type { QpContext } from './work-requests.js'

export function atomic(qp: QpContext, verb: string, opcode: number, remote: RemoteSlice, first: unknown, firstName: string, second: unknown, secondName: string | undefined,
  options: AtomicOptions): Promise<bigint> {
  return new Promise((resolve, reject) => {
    try {
      const compareAddSmall = smallU64(first, firstName)
      const compareAdd = first as bigint
      const swapSmall = secondName === undefined ? 0 : smallU64(second, secondName)
      const swap = secondName === undefined ? 0n : second as bigint
      if (!(remote instanceof RemoteSlice)) throw typeError('a RemoteSlice', 'remote', remote)
      if (remote.length !== 8) throw rangeError('a remote slice of 8 bytes', 'remote.length', remote.length)
      const o = options === NO_OPTIONS ? NO_OPTIONS : optionalObject(options, 'options')
      const wait = o === NO_OPTIONS ? NO_OPTIONS : waitOptions(o)
      let local: LocalSlice
      let owned = false // a library-owned slot, returned once the device is done with it
      if (o.local !== undefined) {
        local = instance(o.local, 'options.local', LocalSlice)
        if (local.length !== 8) throw rangeError('a local slice of 8 bytes', 'options.local.length', local.length)
        local.region.assertUsable()
        if (local.region.pd !== qp.pd) throw wrongPd('options.local')
        // The old value is read from it by the CPU when the atomic completes.
        if (local.region.dmabuf) throw typeError('a slice of memory the CPU can read (not a dma-buf region)', 'options.local', local)
      } else {
        local = qp.atomicSlots.take()
        owned = true
      }
      const slots = qp.atomicSlots
      const giveBack = (): void => { // at most once: a slot in the free list twice would be shared
        if (owned) slots.give(local)
        owned = false
      }
      // A library-owned slot is held by the request like a region: from right before it is posted
      // until the device is done with it (its completion arrived, or its QP was destroyed).
      const hold = owned ? new SlotHold(giveBack) : undefined
      const regions = hold === undefined ? local.region : [local.region, hold]
      const done = (): void => { // the entry is not kept: the value is read from the slot
        const value = readAtomicValue(local)
        giveBack()
        resolve(value)
      }
      const failed = (error: Error): void => {
        // Settled before the device is done with it (a timeout, an abort, a failed CQ): the device
        // may still write the slot, so it goes back when the request finishes, not now.
        if (hold !== undefined && hold[INFLIGHT] > 0) hold.settled = true
        else giveBack()
        reject(error)
      }
      const queues = qp.queues
      if (wait === NO_OPTIONS && queues.takeSendSlotNow()) {
        // The hot path: written straight into the send buffer, no work request object.
        const wrId = queues.takeWrId()
        const pending = new Pending(queues, queues.send, 'send', verb, wrId, wrId, regions, done, failed)
        const encoder = queues.batchEncoder
        const at = encoder.addOne(wrId, opcode, SendFlags.Signaled, local.address, 8, local.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
        encoder.setAtomicOperands(at, compareAdd, compareAddSmall, swap, swapSmall)
        pending.wordStart = at
        return queues.gather(pending)
      }
      const wr: SendWr = {
        wrId: 0, opcode, flags: SendFlags.Signaled, sges: [{ address: local.address, length: 8, lkey: local.lkey }],
        remoteHi: remote.addrHi, remoteLo: remote.addrLo, rkey: remote.rkey, compareAdd, swap,
      }
      try {
        qp.queues.submit('send', verb, 1, regions, wait, done, failed, undefined, wr)
      } catch (error) {
        giveBack() // refused before it was posted
        throw error
      }
    } catch (error) {
      reject(error)
    }
  })
}

/** A library-owned result slot as a request holds it: given back when the request finishes, if its promise settled first. */
class SlotHold implements HeldRegion {
  [INFLIGHT] = 0
  settled = false
  readonly #giveBack: () => void
  constructor(giveBack: () => void) { this.#giveBack = giveBack }

  [RELEASE](): void {
    this[INFLIGHT]--
    if (this.settled) this.#giveBack()
  }
}
