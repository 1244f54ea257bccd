// The fast path of the promise API: a read(), write(), fetchAndAdd() or
// compareAndSwap() with default options, posted at once, is kept in a ring
// slot (RequestRing) with its promise's resolve and reject, not in a Pending
// object: no object per request beyond the promise itself, and no wr_id table.
// Everything else (options, waiting for a queue slot, several work requests,
// sends gathered in one turn) takes the Pending path.
import { completionError, type CompletionEntry } from './pending.js'
import { RequestRing, type RingOwner } from './request-ring.js'
import type { RdmaError } from '../core/errors.js'
import type { HeldRegion } from './held-region.js'
import { TAGGED_VERBS } from './tagged-ops.js' // the same verb indexes
import { PROMISE_WR_ID_BASE } from './wr-ids.js'

/** Where an atomic's old value lands: 8 bytes of a region (verbs' LocalSlice). */
export interface AtomicTarget { readonly region: HeldRegion }

type Resolve = (value: undefined | bigint) => void
type Reject = (error: Error) => void

/** Where library-owned atomic slots go back (the QP's protection domain), and how their value is read. */
export interface AtomicSlots<T extends AtomicTarget> {
  returnAtomicSlot(slot: T): void
  readAtomicValue(slot: T): bigint
}

export class PromiseOps<T extends AtomicTarget = AtomicTarget> extends RequestRing {
  readonly #resolves: Array<Resolve | undefined>
  readonly #rejects: Array<Reject | undefined>
  /** Atomics: where the value before the operation lands; whether that slot is the library's (given back once done). */
  readonly #atomicLocals: Array<T | undefined>
  readonly #ownedLocal: Uint8Array
  #collected: Reject[] = []
  /** The wr_id of the request add() or addAtomic() recorded last. */
  lastWrId = 0
  #executorSlot = 0
  /**
   * The executor of every promise of this ring: it stores the promise's
   * functions straight into the slot being added (no closure per request,
   * and each function is stored once: a store of a new object into the
   * ring's long-lived arrays costs a write barrier).
   */
  readonly #executor = (resolve: Resolve, reject: Reject): void => {
    this.#resolves[this.#executorSlot] = resolve
    this.#rejects[this.#executorSlot] = reject
  }

  constructor(owner: RingOwner, readonly atomicSlots: AtomicSlots<T>, capacity: number) {
    super(owner, capacity, PROMISE_WR_ID_BASE)
    this.#resolves = new Array<Resolve | undefined>(this.mask + 1).fill(undefined)
    this.#rejects = new Array<Reject | undefined>(this.mask + 1).fill(undefined)
    this.#atomicLocals = new Array<T | undefined>(this.mask + 1).fill(undefined)
    this.#ownedLocal = new Uint8Array(this.mask + 1)
  }

  /**
   * Records a WRITE or READ about to be posted (the caller took its send slot
   * and CQ credit); returns its promise. Its wr_id is then `lastWrId`.
   */
  add(region: HeldRegion, verb: number): Promise<undefined> {
    const seq = this.claim(region, verb)
    this.#executorSlot = seq & this.mask
    this.lastWrId = this.wrIdBase + seq
    return new Promise(this.#executor) as Promise<undefined>
  }

  /** As add(), for an atomic whose value lands in `local` (`owned`: a slot of the PD's, given back once done). */
  addAtomic(local: T, owned: boolean, verb: number): Promise<bigint> {
    const promise = this.add(local.region, verb) as unknown as Promise<bigint>
    const slot = (this.lastWrId - this.wrIdBase) & this.mask
    this.#atomicLocals[slot] = local
    this.#ownedLocal[slot] = owned ? 1 : 0
    return promise
  }

  /** Undoes add() for a request the provider refused, and rejects its promise with `error`. */
  refuse(wrId: number, error: Error): void {
    const slot = this.slotOf(wrId)
    if (slot < 0) return
    const reject = this.#rejects[slot]!
    this.release(slot)
    reject(error)
  }

  /** CompletionQueue dispatch: the completion of a fast-path request. */
  complete(entry: CompletionEntry): void {
    const slot = this.slotOf(entry.wrId)
    if (slot < 0) return
    const resolve = this.#resolves[slot]!
    const reject = this.#rejects[slot]!
    const reported = this.reported[slot] === 1
    const local = this.#atomicLocals[slot]
    // An atomic's value is read before release() gives a library-owned slot back.
    const value = entry.status === 0 && !reported && local !== undefined ? this.atomicSlots.readAtomicValue(local) : undefined
    const verb = this.verbs[slot]!
    this.release(slot)
    if (reported) return
    if (entry.status === 0) return resolve(value)
    const error = completionError(entry, TAGGED_VERBS[verb]!)
    if (entry.status !== 5 /* WR_FLUSH_ERR */) this.owner.failed(error)
    reject(error)
  }

  protected override release(slot: number): void {
    const local = this.#atomicLocals[slot]
    if (local !== undefined) {
      if (this.#ownedLocal[slot] === 1) this.atomicSlots.returnAtomicSlot(local)
      this.#atomicLocals[slot] = undefined
    }
    this.#resolves[slot] = undefined
    this.#rejects[slot] = undefined
    super.release(slot)
  }

  protected collect(slot: number): void {
    this.#collected.push(this.#rejects[slot]!)
  }

  /** A rejection reaches its handlers in a microtask anyway: rejected now. */
  protected reportCollected(error: RdmaError): void {
    const rejects = this.#collected
    if (rejects.length === 0) return
    this.#collected = []
    for (const reject of rejects) reject(error)
  }
}
