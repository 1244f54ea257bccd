// Queue pairs: connection setup (INIT -> RTR -> RTS) from a JSON-safe
// endpoint, and every operation as a promise that settles on its completion.
import { native, type NativeQueuePair } from '../native/addon.js'
import { call, closedError, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { QpState, qpStateNames, SendFlags, WrOpcode, type QpStateName, type QpTypeName } from '../core/constants.js'
import { instance, integer, NO_OPTIONS, object, oneOf, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { smallU64 } from '../core/u64.js'
import { Pending } from '../ops/pending.js'
import { WorkRequestEncoder } from '../ops/encoder.js'
import { MAX_SGE_BYTES, splitWr } from '../ops/split.js'
import { QpQueues, type QueuesOwner } from '../ops/qp-queues.js'
import { TAGGED_CMP_SWAP, TAGGED_FETCH_ADD, TAGGED_OPCODES, TAGGED_READ, TAGGED_WRITE, type CompletionHandler, type TaggedOps } from '../ops/tagged-ops.js'
import { CompletionQueue, CQ_DISPATCH } from './completion-queue.js'
import type { ProtectionDomain } from './protection-domain.js'
import { atomicSlotsOf, type AtomicSlotPool } from './atomic-slots.js'
import { SharedReceiveQueue } from './shared-receive-queue.js'
import { MemoryWindow, windowRevoked } from './memory-window.js'
import { LocalSlice, readAtomicValue, type MemoryRegion } from './memory.js'
import { RemoteSlice } from './remote.js'
import { wrongPd } from './local-sges.js'
import { receiveCompletion, type ReceiveCompletion } from './receive-completion.js'
import { isU32, sendWr, taggedArgumentError, type QpContext } from './work-requests.js'
import { bindWindow, invalidate } from './qp-windows.js'
import { collectedQps, type QpLedger } from './qp-collected.js'
import { connectAttributes, endpointOf, udAttributes } from './qp-connect.js'
import { postBatch, postEncoded } from './qp-batch.js'
import { atomic } from './qp-atomics.js'
import { receive, receiveMany, type ReceiveContext } from './qp-receives.js'
import { nativeQpOptions, type AtomicOptions, type BatchOperation, type BatchOptions, type ConnectOptions, type OpOptions, type QpEndpoint, type QueuePairOptions, type SendOptions, type WriteOptions } from './queue-pair-options.js'

/** States in which a peer can use the QP without a request of ours (remote WRITE, READ, atomics). */
const PEER_REACHABLE: ReadonlySet<QpStateName> = new Set<QpStateName>(['RTR', 'RTS', 'SQD', 'SQE'])

const noResult = (): undefined => undefined

export class QueuePair extends Resource {
  protected readonly kind = 'QueuePair'
  /** @internal */ readonly handle: NativeQueuePair
  readonly pd: ProtectionDomain
  readonly type: QpTypeName
  readonly qpn: number
  readonly sendCq: CompletionQueue
  readonly recvCq: CompletionQueue
  readonly srq: SharedReceiveQueue | undefined
  readonly port: number
  readonly caps: { maxSendWr: number; maxRecvWr: number; maxSendSge: number; maxRecvSge: number; maxInlineData: number }
  readonly psn: number
  #state: QpStateName = 'RESET'
  #error: RdmaError | undefined
  readonly #gidIndex: number | undefined
  #orphaned = 0
  /** The work queues: slots, credits, requests in flight, gathering and posting (ops/qp-queues.ts). */
  readonly #queues: QpQueues<LocalSlice>
  /** What building requests needs of this QP (work-requests.ts, qp-windows.ts). */
  readonly #context: QpContext
  /** The PD's library-owned atomic result slots. */
  readonly #atomicSlots: AtomicSlotPool
  #draining = false // close() is delivering the completions already queued

  /** What posting receives needs of this QP (qp-receives.ts). */
  readonly #receiving: ReceiveContext
  /** Bytes one work request may move (the port's max message size); 0 until first asked. */
  #maxMessage = 0
  readonly #ledger: QpLedger
  /**
   * Whether close() has not run, for the hot paths: Resource's `closed`
   * getter is shared by every kind of resource, its property access turns
   * megamorphic, and each read then costs a generic lookup.
   */
  #open = true

  /** Not constructible: made by pd.createQp(). */
  constructor(...notConstructible: never)
  /** @internal `create` makes the native QP (rdma_cm connections pass one that uses rdma_create_qp). */
  constructor(pd: ProtectionDomain, options: QueuePairOptions, create?: (nativeOptions: Record<string, unknown>) => NativeQueuePair)
  constructor(pd: ProtectionDomain, options: QueuePairOptions,
    create = (nativeOptions: Record<string, unknown>) => new native.QueuePair(pd.handle, nativeOptions)) {
    super()
    const o = object(options, 'options')
    this.type = oneOf(o.type, 'options.type', ['RC', 'UC', 'UD'] as const, 'RC')
    this.sendCq = instance(o.sendCq, 'options.sendCq', CompletionQueue)
    this.recvCq = o.recvCq === undefined ? this.sendCq : instance(o.recvCq, 'options.recvCq', CompletionQueue)
    this.srq = o.srq === undefined ? undefined : instance(o.srq, 'options.srq', SharedReceiveQueue)
    this.port = integer(o.port ?? 1, 'options.port', 1, 255)
    this.#gidIndex = o.gidIndex === undefined ? undefined : integer(o.gidIndex, 'options.gidIndex', 0, 255)
    const nativeOptions = nativeQpOptions(o, this.type, this.sendCq, this.recvCq, this.srq)
    for (const cq of [this.sendCq, this.recvCq]) if (cq.closed) throw closedError('CompletionQueue')
    if (this.srq?.closed) throw closedError('SharedReceiveQueue')
    this.pd = pd
    this.handle = call(() => create(nativeOptions))
    this.qpn = this.handle.qpn
    this.caps = this.handle.caps
    this.psn = Math.floor(Math.random() * 0xffffff)
    // What the queues ask of this QP: a separate object, not methods a user could call.
    const owner: QueuesOwner = {
      qpn: this.qpn,
      failed: (error) => this.failed(error),
      moveToError: () => { try { this.#modify('ERR', {}) } catch { /* the QP is failed either way */ } },
      orphaned: () => { this.#orphaned++ },
    }
    const atomicSlots = atomicSlotsOf(pd)
    this.#atomicSlots = atomicSlots
    const queues = new QpQueues<LocalSlice>(owner, this.handle, this.caps, this.sendCq, this.sendCq[CQ_DISPATCH], this.recvCq, this.srq,
      { returnAtomicSlot: (slot) => atomicSlots.give(slot), readAtomicValue })
    this.#queues = queues
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const qp = this
    this.#context = {
      pd, type: this.type, qpn: this.qpn, caps: this.caps, handle: this.handle, queues, atomicSlots,
      get maxMessage() { return qp.#maxMessage },
      overMaxMessage: (length) => this.#overMaxMessage(length),
      assertOpen: () => this.assertOpen(),
    }
    this.#receiving = {
      pd, srq: this.srq, maxRecvSge: this.caps.maxRecvSge, queues,
      toCompletion: (entry) => receiveCompletion(entry, (rkey) => windowRevoked(pd.device, rkey)),
      postRecv: (words, count) => this.handle.postRecv(words, count),
    }
    this.sendCq.addOwner(this.qpn, queues)
    this.recvCq.addOwner(this.qpn, queues)
    pd.device.trackQp(this)
    this.srq?.attach(this)
    this.#ledger = { send: queues.send, recv: queues.recv, recvCq: this.recvCq, srq: this.srq, qpn: this.qpn }
    collectedQps.register(this, this.#ledger, this.#ledger)
    this.adoptedBy(pd, this.sendCq, this.recvCq, ...(this.srq ? [this.srq] : []))
  }

  /** State as last set through this object (query() asks the device). */
  get state(): QpStateName { return this.#state }

  /** The error that moved this QP to the error state, if any. */
  get error(): RdmaError | undefined { return this.#error }

  /** Requests in flight on this QP. */
  get outstanding(): number { return this.#queues.outstanding }

  /** Receives that completed after their promise timed out or was aborted (the message is in that receive's buffer). */
  get orphanedReceives(): number { return this.#orphaned }

  /** This QP's endpoint, to hand to the peer. */
  endpoint(): QpEndpoint {
    this.assertOpen()
    return endpointOf(this, this.#gidIndex ?? this.pd.device.defaultGidIndex(this.port))
  }

  /** Drives RESET -> INIT -> RTR -> RTS towards the peer's endpoint (RC, UC). */
  async connect(remote: QpEndpoint, options: ConnectOptions = {}): Promise<void> {
    this.assertOpen()
    if (this.type === 'UD') throw new RdmaError('A UD queue pair has no peer: use activate()', { code: 'ERR_QP_TYPE' })
    // Every attribute is checked before the first transition: bad input leaves the QP in RESET.
    const { init, rtr, rts } = connectAttributes(this, this.#gidIndex ?? this.pd.device.defaultGidIndex(this.port), remote, options)
    this.#modify('INIT', init)
    this.#modify('RTR', rtr)
    this.#modify('RTS', rts)
  }

  /** Brings a UD queue pair to RTS (it then sends to address handles). */
  async activate(options: { qkey?: number; pkeyIndex?: number } = {}): Promise<void> {
    this.assertOpen()
    if (this.type !== 'UD') throw new RdmaError('activate() is for UD queue pairs: use connect()', { code: 'ERR_QP_TYPE' })
    const { init, rtr, rts } = udAttributes(this, options)
    this.#modify('INIT', init)
    this.#modify('RTR', rtr)
    this.#modify('RTS', rts)
  }

  /** Low-level state transition with explicit verbs attributes (see ibv_modify_qp). */
  modify(state: QpStateName, attributes: Record<string, unknown> = {}): void {
    this.assertOpen()
    oneOf(state, 'state', qpStateNames)
    this.#modify(state, optionalObject(attributes, 'attributes'))
  }

  #modify(state: QpStateName, attributes: Record<string, unknown>): void {
    call(() => this.handle.modify({ ...attributes, qpState: QpState[state] }))
    this.#setState(state)
    if (state === 'ERR') this.failed(new RdmaError(`QP ${this.qpn} was moved to the error state`, { code: 'ERR_QP_STATE', qpn: this.qpn }))
    if (state === 'RESET') {
      this.#error = undefined
      this.#queues.setState(state, undefined, this.#open)
    }
  }

  /** @internal rdma_cm moved the QP to this state. */
  markState(state: QpStateName): void {
    this.#setState(state)
  }

  #setState(state: QpStateName): void {
    this.#state = state
    this.#queues.setState(state, this.#error, this.#open)
    this.pd.device.setQpReachable(this, this.#open && PEER_REACHABLE.has(state))
  }

  /** Current attributes, from the device. */
  query(): Record<string, unknown> & { state: QpStateName } {
    this.assertOpen()
    const q = call(() => this.handle.query())
    return { ...q, state: qpStateNames[q.qpState as number] ?? 'ERR' }
  }

  // --- operations -------------------------------------------------------

  /** RDMA WRITE (WRITE_WITH_IMM with options.immediate) of the local bytes to the remote slice; lengths must match. */
  write(local: LocalSlice | readonly LocalSlice[], remote: RemoteSlice, options: WriteOptions = NO_OPTIONS): Promise<void> {
    return this.#one('write', local, remote, options)
  }

  /** RDMA READ of the remote slice into the local slices; lengths must match. */
  read(local: LocalSlice | readonly LocalSlice[], remote: RemoteSlice, options: OpOptions = NO_OPTIONS): Promise<void> {
    return this.#one('read', local, remote, options)
  }

  /** SEND (SEND_WITH_IMM / SEND_WITH_INV with options); an empty array sends a zero-length message. */
  send(local: LocalSlice | readonly LocalSlice[], options: SendOptions = NO_OPTIONS): Promise<void> {
    return this.#one('send', local, undefined, options)
  }

  /** Posts a receive buffer; resolves when a message lands in it. */
  recv(local: LocalSlice | readonly LocalSlice[], options: WaitOptions = {}): Promise<ReceiveCompletion> {
    return receive(this.#receiving, local, options)
  }

  /**
   * Posts several receive buffers with one native call (one doorbell), in
   * order: one promise per buffer, each resolved when a message lands in it.
   * Checks and options as recv() (a timeout or signal applies to each
   * receive); the receives wait together for queue slots. What recv() would
   * reject with before posting (bad slices, a closed or RESET QP, an SRQ QP,
   * more receives than the queue holds) is thrown here, and nothing is posted.
   */
  recvMany(locals: ReadonlyArray<LocalSlice | readonly LocalSlice[]>, options: WaitOptions = {}): Array<Promise<ReceiveCompletion>> {
    return receiveMany(this.#receiving, locals, options)
  }

  /** Atomic compare-and-swap on 8 remote bytes; resolves with the value before the operation. */
  compareAndSwap(remote: RemoteSlice, compare: bigint, swap: bigint, options: AtomicOptions = NO_OPTIONS): Promise<bigint> {
    if (options === NO_OPTIONS) {
      const fast = this.#fastAtomic(TAGGED_CMP_SWAP, remote, compare, swap)
      if (fast !== undefined) return fast
    }
    return atomic(this.#context, 'compareAndSwap', WrOpcode.AtomicCmpAndSwp, remote, compare, 'compare', swap, 'swap', options)
  }

  /** Atomic fetch-and-add on 8 remote bytes; resolves with the value before the addition. */
  fetchAndAdd(remote: RemoteSlice, add: bigint, options: AtomicOptions = NO_OPTIONS): Promise<bigint> {
    if (options === NO_OPTIONS) {
      const fast = this.#fastAtomic(TAGGED_FETCH_ADD, remote, add, 0n)
      if (fast !== undefined) return fast
    }
    return atomic(this.#context, 'fetchAndAdd', WrOpcode.AtomicFetchAndAdd, remote, add, 'add', 0n, undefined, options)
  }

  /**
   * The lower-level completion path: `handler(tag, error)` is called once for
   * each request posted with postWrite(), postRead(), postFetchAndAdd() or
   * postCompareAndSwap(): from the event loop
   * (the CQ's channel or busy poll), from `cq.poll()`, from `qp.close()` (what
   * the device completed before it), or in a microtask right after a post
   * that found completions by polling; never from inside a post call.
   * Undefined removes it (refused with ERR_BUSY while tagged requests are in flight).
   */
  setCompletionHandler(handler: CompletionHandler | undefined): void {
    this.assertOpen()
    if (handler !== undefined && typeof handler !== 'function') throw typeError('a function or undefined', 'handler', handler)
    this.#queues.setHandler(handler)
  }

  /**
   * One signaled RDMA WRITE, reported to the completion handler with `tag`
   * (0 .. 2^32-1) instead of a promise. Throws at once, with a code, what the
   * promise path would reject with, and ERR_QUEUE_FULL / ERR_CQ_FULL when the
   * send queue or the CQ has no room now (it never waits). No timeout: close
   * the QP to end requests that never complete (each is then reported with
   * ERR_CLOSED). At most the port's max message size (no splitting).
   */
  postWrite(local: LocalSlice, remote: RemoteSlice, tag: number): void {
    this.#postTagged(TAGGED_WRITE, local, remote, tag)
  }

  /** One signaled RDMA READ (RC), as postWrite(). */
  postRead(local: LocalSlice, remote: RemoteSlice, tag: number): void {
    this.#postTagged(TAGGED_READ, local, remote, tag)
  }

  /**
   * One atomic fetch-and-add (RC) on the 8 bytes of `remote`, as postWrite():
   * the value before the addition lands in `local` (8 bytes of a region of
   * this PD, little-endian as the remote word) by the time `tag` is reported.
   */
  postFetchAndAdd(local: LocalSlice, remote: RemoteSlice, add: bigint, tag: number): void {
    this.#postTaggedAtomic(TAGGED_FETCH_ADD, local, remote, tag, add, 0n)
  }

  /** One atomic compare-and-swap (RC), as postFetchAndAdd(): the old value lands in `local`. */
  postCompareAndSwap(local: LocalSlice, remote: RemoteSlice, compare: bigint, swap: bigint, tag: number): void {
    this.#postTaggedAtomic(TAGGED_CMP_SWAP, local, remote, tag, compare, swap)
  }

  /** The checks every tagged post starts with (a handler set, the slices' types, the tag, the region usable and of this PD): the ring. */
  #taggedRing(verbIndex: number, local: LocalSlice, remote: RemoteSlice, tag: number): TaggedOps {
    const tagged = this.#queues.tagged
    if (tagged === undefined || !(local instanceof LocalSlice) || !(remote instanceof RemoteSlice) || !isU32(tag)) {
      throw taggedArgumentError(this.#context, verbIndex, local, remote, tag)
    }
    const region = local.region
    region.assertUsable()
    if (region.pd !== this.pd) throw wrongPd('local')
    return tagged
  }

  // A tagged WRITE or READ, and a tagged atomic: two functions, so that V8
  // optimizes each with its own inlining budget (one function for both left
  // the atomic's helpers as calls once both kinds had run: ~0.4k
  // instructions per fetch-and-add).
  #postTagged(verbIndex: number, local: LocalSlice, remote: RemoteSlice, tag: number): void {
    const tagged = this.#taggedRing(verbIndex, local, remote, tag)
    const length = local.length
    if (remote.length !== length || (verbIndex === TAGGED_WRITE ? this.type === 'UD' : this.type !== 'RC') ||
      (length > this.#maxMessage && this.#overMaxMessage(length))) {
      throw taggedArgumentError(this.#context, verbIndex, local, remote, tag)
    }
    this.#queues.postTagged(tagged, verbIndex, local, remote, tag, 0n, 0, 0n, 0)
  }

  #postTaggedAtomic(verbIndex: number, local: LocalSlice, remote: RemoteSlice, tag: number, first: bigint, second: bigint): void {
    const tagged = this.#taggedRing(verbIndex, local, remote, tag)
    if (local.length !== 8 || remote.length !== 8) throw taggedArgumentError(this.#context, verbIndex, local, remote, tag)
    // smallU64(): the operand below 2^32 as a number, else -1
    const compareAddSmall = smallU64(first, verbIndex === TAGGED_FETCH_ADD ? 'add' : 'compare')
    const swapSmall = verbIndex === TAGGED_CMP_SWAP ? smallU64(second, 'swap') : 0
    if (this.type !== 'RC') throw taggedArgumentError(this.#context, verbIndex, local, remote, tag)
    this.#queues.postTagged(tagged, verbIndex, local, remote, tag, first, compareAddSmall, second, swapSmall)
  }

  /**
   * Binds a memory window over part of a region (the region needs
   * Access.MwBind) and resolves with a descriptor of the window for the peer.
   */
  bindWindow(window: MemoryWindow, slice: LocalSlice, access: number, options: WaitOptions = {}): Promise<{ version: 1; addr: string; rkey: number; length: number }> {
    return bindWindow(this.#context, window, slice, access, options)
  }

  /** LOCAL_INV: invalidates a type 2 memory window's rkey on this device. */
  invalidate(rkey: number, options: WaitOptions = {}): Promise<void> {
    return invalidate(this.#context, rkey, options)
  }

  /**
   * Posts many work requests with one native call (one doorbell). With
   * completions 'last' only the final request is signaled; the promise
   * resolves when all have completed, or rejects with the first failure.
   */
  postBatch(operations: readonly BatchOperation[], options: BatchOptions = {}): Promise<void> {
    return postBatch(this.#context, operations, options)
  }

  /**
   * @internal The transfer engine's hot path: `count` RDMA WRITEs (or READs)
   * in one post, written by `encode(firstWrId, encoder)` straight from the
   * caller's columns (qp-batch.ts).
   */
  postEncoded(verb: 'write' | 'read' | 'send', count: number, regions: readonly MemoryRegion[],
    encode: (firstWrId: number, enc: WorkRequestEncoder) => void): Promise<void> {
    return postEncoded(this.#context, verb, count, regions, encode)
  }

  /**
   * The hot path of fetchAndAdd() and compareAndSwap(): default options, the
   * first send of a turn, a slot and credit free now, operands that check.
   * The value lands in a library-owned slot. Anything else returns undefined
   * and takes the general path, which checks the same things and says why.
   */
  #fastAtomic(verbIndex: number, remote: RemoteSlice, first: unknown, second: unknown): Promise<bigint> | undefined {
    if (this.#queues.turnOpen || !(remote instanceof RemoteSlice) || remote.length !== 8 || this.type !== 'RC') return undefined
    let compareAddSmall: number
    let swapSmall = 0
    try {
      compareAddSmall = smallU64(first, 'add')
      if (verbIndex === TAGGED_CMP_SWAP) swapSmall = smallU64(second, 'swap')
    } catch {
      return undefined
    }
    let local: LocalSlice
    try {
      local = this.#atomicSlots.take() // may register a page of slots: a failure is the general path's to report
    } catch {
      return undefined
    }
    if (!this.#queues.takeSendSlotNow()) {
      this.#atomicSlots.give(local)
      return undefined
    }
    const promise = this.#queues.promised.addAtomic(local, true, verbIndex)
    this.#queues.postNow(this.#queues.promised.lastWrId, verbIndex, local, remote, first as bigint, compareAddSmall, verbIndex === TAGGED_CMP_SWAP ? second as bigint : 0n, swapSmall)
    return promise
  }

  /** Whether `length` is over the port's max message size (asked once, on the first non-empty operation). */
  #overMaxMessage(length: number): boolean {
    if (this.#maxMessage === 0) this.#maxMessage = Math.min(this.pd.device.queryPort(this.port).maxMessageSize || MAX_SGE_BYTES, MAX_SGE_BYTES)
    return length > this.#maxMessage
  }

  /** One signaled write, read or send: the common case, without batch bookkeeping. */
  #one(kind: 'write' | 'read' | 'send', local: unknown, remote: unknown, options: unknown): Promise<void> {
    if (options === NO_OPTIONS && kind !== 'send' && local instanceof LocalSlice && remote instanceof RemoteSlice) {
      const fast = this.#fastOne(kind, local, remote)
      if (fast !== undefined) return fast
    }
    return new Promise((resolve, reject) => {
      try {
        const o = options === NO_OPTIONS ? NO_OPTIONS : optionalObject(options, 'options')
        const wait = o === NO_OPTIONS ? NO_OPTIONS : waitOptions(o)
        const flags = SendFlags.Signaled | (o.fence ? SendFlags.Fence : 0) | (o.solicited ? SendFlags.Solicited : 0)
        const { wr, regions, length } = sendWr(this.#context, kind, local, remote, o, -1, flags)
        if (length > this.#maxMessage && this.#overMaxMessage(length)) {
          // Over the max message size: several requests, posted together, the last signaled.
          this.#queues.split(kind, splitWr(wr, length, this.#maxMessage), regions, wait, resolve, reject)
        } else {
          this.#queues.submit('send', kind, 1, regions, wait, resolve, reject, noResult, wr)
        }
      } catch (error) {
        reject(error)
      }
    })
  }

  /**
   * The hot path of read() and write(): one slice, default options, a queue
   * slot and a CQ credit free now. The work request is written straight into
   * the send buffer. Anything else (including every error) returns undefined
   * and takes the general path, which checks the same things and says why.
   */
  #fastOne(kind: 'write' | 'read', local: LocalSlice, remote: RemoteSlice): Promise<void> | undefined {
    const region = local.region
    const length = local.length
    if (region.pd !== this.pd || remote.length !== length || length > this.#maxMessage ||
      (kind === 'read' ? this.type !== 'RC' : this.type === 'UD')) return undefined
    try { region.assertUsable() } catch { return undefined }
    const queues = this.#queues
    if (!queues.takeSendSlotNow()) return undefined
    const verbIndex = kind === 'read' ? TAGGED_READ : TAGGED_WRITE
    if (!queues.turnOpen) {
      const promised = queues.promised
      const promise = promised.add(region, verbIndex)
      queues.postNow(promised.lastWrId, verbIndex, local, remote, 0n, 0, 0n, 0)
      return promise
    }
    const wrId = queues.takeWrId()
    let pending: Pending
    const promise = new Promise<void>((resolve, reject) => {
      pending = new Pending(queues, queues.send, 'send', kind, wrId, wrId, region, resolve, reject, noResult)
    })
    pending!.wordStart = queues.batchEncoder.addOne(wrId, TAGGED_OPCODES[verbIndex]!, SendFlags.Signaled,
      region.address + local.offset, length, region.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
    queues.gather(pending!)
    return promise
  }

  /** @internal An error completion or a QP async event moved the QP to the error state. */
  failed(error: RdmaError): void {
    if (this.#error) return
    this.#error = error
    this.#setState('ERR')
    this.#queues.failWaiting(this.#queues.stateError('post'))
  }

  protected override afterClose(): void {
    this.#open = false
    this.#queues.setState(this.#state, this.#error, false)
    this.pd.device.untrackQp(this)
    this.sendCq.removeOwner(this.qpn)
    this.recvCq.removeOwner(this.qpn)
    this.srq?.detach(this)
    collectedQps.unregister(this.#ledger) // close() gives everything back itself
  }

  /**
   * Completions already in the QP's queues are delivered before it is
   * destroyed: what the device finished settles as finished (a WRITE that
   * landed resolves, a message that arrived is received) instead of being
   * rejected as closed. A close() called again from a completion delivered
   * here returns at once; this one completes it.
   */
  override close(): void {
    if (this.closed || this.#draining) return
    if (this.outstanding > 0) {
      this.#draining = true
      try {
        this.sendCq.drainBeforeClose()
        if (this.recvCq !== this.sendCq) this.recvCq.drainBeforeClose()
      } finally {
        this.#draining = false
      }
    }
    super.close()
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
    this.#queues.abandonAll() // the device is done with every buffer this QP named
  }
}
