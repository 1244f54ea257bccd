// Shared receive queue: one pool of receive buffers for many QPs.
import { native, type NativeSharedReceiveQueue } from '../native/addon.js'
import { call, closedError, fromNative, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { abandonAll, Pending, type CompletionEntry } from '../ops/pending.js'
import { ReceiveBatch } from '../ops/receive-batch.js'
import { SRQ_WR_IDS } from '../ops/wr-ids.js'
import { PendingTable } from '../ops/pending-table.js'
import { WorkRequestEncoder } from '../ops/encoder.js'
import { integer, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import type { ProtectionDomain } from './protection-domain.js'
import type { LocalSlice } from './memory.js'
import type { CompletionQueue } from './completion-queue.js'
import { localSges } from './local-sges.js'
import { receiveCompletion, type ReceiveCompletion } from './receive-completion.js'
import { windowRevoked } from './memory-window.js'

export interface SharedReceiveQueueOptions { maxWr?: number; maxSge?: number }

/** A QP attached to an SRQ, as the SRQ sees it. */
interface AttachedQp { readonly qpn: number; readonly recvCq: CompletionQueue; failed(error: RdmaError): void }

/** SRQs with receives waiting, held: a receive in flight keeps its SRQ alive until it settles (see QueueLedger in queue-pair.ts). */
const busySrqs = new Set<SharedReceiveQueue>()

export class SharedReceiveQueue extends Resource {
  protected readonly kind = 'SharedReceiveQueue'
  /** @internal */ readonly handle: NativeSharedReceiveQueue
  readonly pd: ProtectionDomain
  readonly maxWr: number
  readonly maxSge: number
  readonly qpn = 0
  /** The receive CQs of the attached QPs (with how many QPs use each): a receive may complete on any of them. */
  readonly #cqs = new Map<CompletionQueue, number>()
  #pending = 0
  #orphaned = 0
  readonly #outstanding = new Set<Pending>()
  /** The attached QPs by QP number (weakly: a dropped QP can still be collected): a receive's failure fails the QP it arrived on. */
  readonly #qps = new Map<number, WeakRef<AttachedQp>>()
  /** @internal PendingOwner */
  readonly pendings: PendingTable
  readonly #wrIds = SRQ_WR_IDS
  readonly #revoked = (rkey: number): void => windowRevoked(this.pd.device, rkey)
  /** Encodes receives (used and emptied within one call). */
  readonly #encoder = new WorkRequestEncoder()

  /** Not constructible: made by pd.createSrq(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(pd: ProtectionDomain, options?: SharedReceiveQueueOptions)
  constructor(pd: ProtectionDomain, options: SharedReceiveQueueOptions = {}) {
    super()
    const o = optionalObject(options, 'options')
    this.maxWr = integer(o.maxWr ?? 256, 'options.maxWr', 1, 1 << 20)
    this.maxSge = integer(o.maxSge ?? 1, 'options.maxSge', 1, 64)
    this.pd = pd
    this.pendings = new PendingTable(this.maxWr)
    this.handle = call(() => new native.SharedReceiveQueue(pd.handle, this.maxWr, this.maxSge, 0))
    this.kernelHandle = this.handle.handle
    pd.device.trackSrq(this)
    this.adoptedBy(pd)
  }

  /** @internal the kernel's handle, named by SRQ async events (kept: untracking runs after the handle is gone) */
  readonly kernelHandle: number

  /** Receives that completed after their promise timed out or was aborted (the message is in that receive's buffer). */
  get orphanedReceives(): number { return this.#orphaned }

  /** @internal A QP that receives through this SRQ: its receive CQ polls for our receives while any wait. */
  attach(qp: AttachedQp): void {
    this.#qps.set(qp.qpn, new WeakRef(qp))
    const cq = qp.recvCq
    const users = this.#cqs.get(cq) ?? 0
    this.#cqs.set(cq, users + 1)
    if (users === 0) for (let i = 0; i < this.#pending; i++) cq.addPending()
  }

  /** @internal The QP is closed (or was collected: then `qp` is what it left, its number and CQ). */
  detach(qp: { recvCq: CompletionQueue; qpn: number }): void {
    const attached = this.#qps.get(qp.qpn)?.deref()
    // Not a newer QP that got the same number before the finalizer of a collected one ran.
    if (attached === undefined || attached === qp) this.#qps.delete(qp.qpn)
    const cq = qp.recvCq
    const users = this.#cqs.get(cq)
    if (users === undefined) return
    if (users > 1) return void this.#cqs.set(cq, users - 1)
    this.#cqs.delete(cq)
    for (let i = 0; i < this.#pending; i++) cq.removePending()
  }

  /** @internal PendingCounter: every receive CQ of an attached QP keeps the loop alive (and polls, in busy mode). */
  addPending(): void {
    if (this.#pending++ === 0) busySrqs.add(this)
    for (const cq of this.#cqs.keys()) cq.addPending()
  }

  /** @internal PendingCounter */
  removePending(): void {
    if (--this.#pending === 0) busySrqs.delete(this)
    for (const cq of this.#cqs.keys()) cq.removePending()
  }

  /** Posts a receive buffer shared by the attached QPs. */
  recv(local: LocalSlice | readonly LocalSlice[], options: WaitOptions = {}): Promise<ReceiveCompletion> {
    return new Promise((resolve, reject) => {
      try {
        this.assertOpen()
        const wait = waitOptions(options)
        const { sges, regions } = localSges(local, 'local', this.maxSge, this.pd)
        const first = this.#wrIds.take(1)
        const pending = new Pending(this, this, 'recv', 'recv', first, first, regions, (entry) => resolve(receiveCompletion(entry, this.#revoked)), reject)
        const encoder = this.#encoder
        encoder.reset()
        encoder.addRecv(first, sges)
        pending.track(wait)
        this.#outstanding.add(pending)
        try {
          this.handle.postRecv(encoder.buffer, 1)
        } catch (cause) {
          pending.untrack()
          throw fromNative(cause)
        }
      } catch (error) {
        reject(error)
      }
    })
  }

  /**
   * Posts several receive buffers with one native call, in order: one promise
   * per buffer (as qp.recvMany()). What recv() would reject with before
   * posting (bad slices, a closed SRQ) is thrown, and nothing is posted; a
   * buffer the provider refuses (e.g. the SRQ is full: ENOMEM) rejects with
   * the ones after it, and the ones before it stay posted.
   */
  recvMany(locals: ReadonlyArray<LocalSlice | readonly LocalSlice[]>, options: WaitOptions = {}): Array<Promise<ReceiveCompletion>> {
    this.assertOpen()
    if (!Array.isArray(locals)) throw typeError('an array of receive buffers (each a LocalSlice or an array of them)', 'locals', locals)
    const wait = waitOptions(options)
    const buffers = locals.map((local, i) => localSges(local, `locals[${i}]`, this.maxSge, this.pd))
    if (buffers.length === 0) return []
    const receives = new ReceiveBatch<ReceiveCompletion>(buffers)
    receives.post(this, this, this.#wrIds, this.#encoder, wait, (entry) => receiveCompletion(entry, this.#revoked), (words, count) => this.handle.postRecv(words, count),
      (pending) => this.#outstanding.add(pending))
    return receives.promises
  }

  /** Raises the 'SRQ_LIMIT_REACHED' device event once fewer than `limit` receives remain. */
  arm(limit: number): void {
    this.assertOpen()
    integer(limit, 'limit', 1, this.maxWr)
    call(() => this.handle.arm(limit))
  }

  query(): { maxWr: number; maxSge: number; limit: number } {
    this.assertOpen()
    return call(() => this.handle.query())
  }

  /** @internal */
  released(pending: Pending): void { this.#outstanding.delete(pending) }
  /** @internal A receive completed with an error: the QP it arrived on fails, as with a receive queue of its own. */
  failed(error: RdmaError): void {
    if (error.qpn !== undefined) this.#qps.get(error.qpn)?.deref()?.failed(error)
  }
  /** @internal */
  orphaned(_entry: CompletionEntry): void { this.#orphaned++ }

  protected override afterClose(): void {
    this.pd.device.untrackSrq(this)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
    const error = closedError(this.kind)
    abandonAll(this.#outstanding, error)
  }
}
