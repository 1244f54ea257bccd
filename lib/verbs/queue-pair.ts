// Queue pairs: connection setup (INIT -> RTR -> RTS) from a JSON-safe
// endpoint, and every operation as a promise that settles on its completion.
import { native, SEND_POSTER_ONE, SEND_POSTER_ONE_POLL, type NativeQueuePair, type PostFunction, type PostOneFunction } from '../native/addon.js'
import { call, closedError, fromNative, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { Access, mtuEnum, QpState, qpStateNames, QpType, SendFlags, WrOpcode, type QpStateName, type QpTypeName } from '../core/constants.js'
import { boolean, instance, integer, object, oneOf, optionalObject, typeError, rangeError, uint64, waitOptions, type WaitOptions } from '../core/validate.js'
import { smallU64 } from '../core/u64.js'
import { PendingTable } from '../ops/pending-table.js'
import { abandonAll, Pending, type CompletionEntry } from '../ops/pending.js'
import { WorkRequestEncoder, type SendWr, type Sge } from '../ops/encoder.js'
import { MAX_SGE_BYTES, splitWr } from '../ops/split.js'
import { abortError, SlotWait, WorkQueueSlots } from '../ops/slots.js'
import { QueueLedger } from '../ops/queue-ledger.js'
import { ReceiveBatch } from '../ops/receive-batch.js'
import { PROMISE_WR_ID_BASE, QP_WR_ID_BASE, TAGGED_WR_ID_BASE, WrIdAllocator } from '../ops/wr-ids.js'
import { PromiseOps } from '../ops/promise-ops.js'
import {
  handlerBusy, TAGGED_CMP_SWAP, TAGGED_FETCH_ADD, TAGGED_OPCODES, TAGGED_READ, TAGGED_VERBS, TAGGED_WRITE, TaggedOps, type CompletionHandler,
} from '../ops/tagged-ops.js'
import { CompletionQueue, CQ_DISPATCH } from './completion-queue.js'
import type { ProtectionDomain } from './protection-domain.js'
import { SharedReceiveQueue } from './shared-receive-queue.js'
import { AddressHandle } from './address-handle.js'
import { MemoryWindow } from './memory-window.js'
import { LocalSlice, readAtomicValue, type MemoryRegion } from './memory.js'
import { RemoteSlice } from './remote.js'
import { localSges, wrongPd } from './local-sges.js'
import { receiveCompletion, type ReceiveCompletion } from './receive-completion.js'
import type {
  AtomicOptions, BatchOperation, BatchOptions, ConnectOptions, OpOptions, QpEndpoint, QueuePairOptions, SendOptions, WriteOptions,
} from './queue-pair-options.js'

interface QpLedger { send: QueueLedger; recv: QueueLedger; recvCq: CompletionQueue; srq: SharedReceiveQueue | undefined }

/** States in which a peer can use the QP without a request of ours (remote WRITE, READ, atomics). */
const PEER_REACHABLE: ReadonlySet<QpStateName> = new Set<QpStateName>(['RTR', 'RTS', 'SQD', 'SQE'])

/** A QP garbage-collected without close() gives back what it held on its CQs and SRQ. */
const collectedQps = new FinalizationRegistry<QpLedger>(({ send, recv, recvCq, srq }) => {
  send.giveAll()
  recv.giveAll()
  srq?.detach({ recvCq })
})

/** Sends gathered during one turn of the event loop, posted together. */
class SendBatch {
  readonly encoder = new WorkRequestEncoder()
  /**
   * The requests encoded, in order, in pendings[0, count); each knows where
   * its words start (Pending.wordStart). Emptied by count (and the slots
   * cleared), never by `length = 0`: that frees the array's storage, which
   * the next push allocates again (~0.5k instructions per operation, in
   * the runtime's length setter and the array's regrowth).
   */
  readonly pendings: Array<Pending | undefined> = []
  count = 0
  wrs = 0
  /** The native post function bound to `bound` (the encoder's buffer, replaced when it grows). */
  post: PostFunction | undefined
  bound: Uint32Array | undefined
}

/** The buffer of the ring requests (tagged, and the promises' fast path): one request at word 0, posted by itself. */
class SingleRequest {
  readonly encoder = new WorkRequestEncoder()
  /** The native functions bound to `bound` (the encoder's buffer): post and poll once, and post alone. */
  postPoll: PostOneFunction | undefined
  post: PostOneFunction | undefined
  bound: Uint32Array | undefined
}

/** Runs `fn` at the end of the current microtask checkpoint (cheaper than queueMicrotask, which wraps each call in an AsyncResource). */
const RESOLVED = Promise.resolve()

/** Argument names for messages: index -1 is a single operation, else operations[index]. */
const opNameOf = (index: number): string => index < 0 ? 'options' : `operations[${index}]`
const localNameOf = (index: number): string => index < 0 ? 'local' : `operations[${index}].local`

const isU32 = (value: unknown): boolean => typeof value === 'number' && value >>> 0 === value
const noResult = (): undefined => undefined
/** Default options object: lets the hot path skip option parsing. */
const NO_OPTIONS: Readonly<Record<string, never>> = Object.freeze({})

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
  /** @internal PendingOwner: requests in flight by the wr_id of their last work request (every request in flight is here). */
  readonly pendings: PendingTable
  #orphaned = 0
  /** The lower-level completion path (setCompletionHandler()): its requests in flight and their handler. */
  #tagged: TaggedOps | undefined
  /** The promises' fast path: requests in flight and their resolve and reject (no Pending object). */
  readonly #promised: PromiseOps<LocalSlice>
  /** Ring requests (tagged, and the promises' fast path) are posted one per call, from their own buffer (bound to the native post function once). */
  readonly #single = new SingleRequest()
  /** Ids of this QP's Pending requests; receives and custom posts are encoded with #encoder (used and emptied within one call). */
  readonly #wrIds = new WrIdAllocator(QP_WR_ID_BASE)
  readonly #encoder = new WorkRequestEncoder()
  #draining = false // close() is delivering the completions already queued
  readonly #sendSlots: WorkQueueSlots
  #sendBatch = new SendBatch()
  #spareBatch = new SendBatch()
  #flushScheduled = false
  #turnOpen = false
  readonly #receiveCompletion = (entry: CompletionEntry): ReceiveCompletion => receiveCompletion(entry, this.pd.device)
  readonly #closeTurn = (): void => { this.#turnOpen = false }
  readonly #recvSlots: WorkQueueSlots
  /** Bytes one work request may move (the port's max message size); 0 until first asked. */
  #maxMessage = 0
  readonly #ledger: QpLedger
  /** The send CQ's count word: a post that polls in the same native call finds its count there. */
  readonly #sendCountWord: Uint32Array
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
    const nativeOptions = {
      type: QpType[this.type],
      sendCq: this.sendCq.handle,
      recvCq: this.recvCq.handle,
      srq: this.srq?.handle,
      maxSendWr: integer(o.maxSendWr ?? 128, 'options.maxSendWr', 1, 1 << 20),
      maxRecvWr: integer(o.maxRecvWr ?? 128, 'options.maxRecvWr', 1, 1 << 20),
      maxSendSge: integer(o.maxSendSge ?? 1, 'options.maxSendSge', 1, 64),
      maxRecvSge: integer(o.maxRecvSge ?? 1, 'options.maxRecvSge', 1, 64),
      maxInlineData: integer(o.maxInlineData ?? 0, 'options.maxInlineData', 0, 1 << 16),
    }
    for (const cq of [this.sendCq, this.recvCq]) if (cq.closed) throw closedError('CompletionQueue')
    if (this.srq?.closed) throw closedError('SharedReceiveQueue')
    this.pd = pd
    this.handle = call(() => create(nativeOptions))
    this.qpn = this.handle.qpn
    this.caps = this.handle.caps
    this.psn = Math.floor(Math.random() * 0xffffff)
    this.pendings = new PendingTable(this.caps.maxSendWr + this.caps.maxRecvWr)
    this.#sendSlots = new WorkQueueSlots(this.caps.maxSendWr)
    this.#promised = new PromiseOps<LocalSlice>(this, { returnAtomicSlot: (slot) => pd.returnAtomicSlot(slot), readAtomicValue }, this.caps.maxSendWr)
    this.#recvSlots = new WorkQueueSlots(this.srq ? 0 : this.caps.maxRecvWr)
    this.#sendCountWord = this.sendCq[CQ_DISPATCH].countWord
    this.sendCq.addOwner(this.qpn, this)
    this.recvCq.addOwner(this.qpn, this)
    pd.device.trackQp(this)
    this.srq?.attach(this)
    this.#ledger = { send: new QueueLedger(this.sendCq), recv: new QueueLedger(this.recvCq), recvCq: this.recvCq, srq: this.srq }
    collectedQps.register(this, this.#ledger, this.#ledger)
    this.adoptedBy(pd, this.sendCq, this.recvCq, ...(this.srq ? [this.srq] : []))
  }

  /** State as last set through this object (query() asks the device). */
  get state(): QpStateName { return this.#state }

  /** The error that moved this QP to the error state, if any. */
  get error(): RdmaError | undefined { return this.#error }

  /** Requests in flight on this QP. */
  get outstanding(): number { return this.pendings.size + this.#promised.inFlight + (this.#tagged?.inFlight ?? 0) }

  /** Receives that completed after their promise timed out or was aborted (the message is in that receive's buffer). */
  get orphanedReceives(): number { return this.#orphaned }

  /** This QP's endpoint, to hand to the peer. */
  endpoint(): QpEndpoint {
    this.assertOpen()
    const portInfo = this.pd.device.queryPort(this.port)
    const gidIndex = this.#gidIndex ?? this.pd.device.defaultGidIndex(this.port)
    const gid = this.pd.device.gids(this.port).find((g) => g.index === gidIndex)?.gid ?? '::'
    return { version: 1, type: this.type, qpn: this.qpn, psn: this.psn, lid: portInfo.lid, gid, gidIndex, mtu: portInfo.activeMtu, port: this.port }
  }

  /** Drives RESET -> INIT -> RTR -> RTS towards the peer's endpoint (RC, UC). */
  async connect(remote: QpEndpoint, options: ConnectOptions = {}): Promise<void> {
    this.assertOpen()
    if (this.type === 'UD') throw new RdmaError('A UD queue pair has no peer: use activate()', { code: 'ERR_QP_TYPE' })
    const r = object(remote, 'remote')
    const o = optionalObject(options, 'options')
    if (r.version !== 1) throw typeError('an endpoint of version 1', 'remote.version', r.version)
    if (r.type !== undefined && r.type !== this.type) throw typeError(`a ${this.type} endpoint`, 'remote.type', r.type)
    const destQpNum = integer(r.qpn, 'remote.qpn', 0, 0xffffff)
    const rqPsn = integer(r.psn, 'remote.psn', 0, 0xffffff)
    const dlid = integer(r.lid ?? 0, 'remote.lid', 0, 0xffff)
    if (typeof r.gid !== 'string') throw typeError('a GID string', 'remote.gid', r.gid)
    const local = this.pd.device.queryPort(this.port)
    const remoteMtu = integer(r.mtu ?? local.activeMtu, 'remote.mtu', 256, 4096)
    const mtu = o.mtu === undefined ? Math.min(local.activeMtu, remoteMtu) : integer(o.mtu, 'options.mtu', 256, 4096)
    const device = this.pd.device.query()
    const global = local.linkLayer === 'Ethernet' || r.gid !== '::'
    const gidIndex = this.#gidIndex ?? this.pd.device.defaultGidIndex(this.port)
    const u8 = (key: keyof ConnectOptions, fallback: number, max = 255) => integer(o[key] ?? fallback, `options.${key}`, 0, max)
    this.#modify('INIT', {
      pkeyIndex: u8('pkeyIndex', 0, 0xffff),
      portNum: this.port,
      accessFlags: u8('accessFlags', Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic, 0xffffffff),
    })
    const ahAttr: Record<string, unknown> = { dlid, sl: u8('sl', 0, 15), portNum: this.port }
    if (global) {
      ahAttr.grh = { dgid: r.gid, sgidIndex: gidIndex, hopLimit: u8('hopLimit', 64), trafficClass: u8('trafficClass', 0), flowLabel: u8('flowLabel', 0, 0xfffff) }
    }
    const rtr: Record<string, unknown> = { pathMtu: mtuEnum(mtu), destQpNum, rqPsn, ahAttr }
    if (this.type === 'RC') {
      rtr.maxDestRdAtomic = u8('maxDestRdAtomic', Math.min(16, device.maxQpRdAtom))
      rtr.minRnrTimer = u8('minRnrTimer', 12, 31)
    }
    this.#modify('RTR', rtr)
    const rts: Record<string, unknown> = { sqPsn: this.psn }
    if (this.type === 'RC') {
      rts.timeout = u8('timeout', 14, 31)
      rts.retryCount = u8('retryCount', 7, 7)
      rts.rnrRetry = u8('rnrRetry', 7, 7)
      rts.maxRdAtomic = u8('maxRdAtomic', Math.min(16, device.maxQpInitRdAtom))
    }
    this.#modify('RTS', rts)
  }

  /** Brings a UD queue pair to RTS (it then sends to address handles). */
  async activate(options: { qkey?: number; pkeyIndex?: number } = {}): Promise<void> {
    this.assertOpen()
    if (this.type !== 'UD') throw new RdmaError('activate() is for UD queue pairs: use connect()', { code: 'ERR_QP_TYPE' })
    const o = optionalObject(options, 'options')
    this.#modify('INIT', { pkeyIndex: integer(o.pkeyIndex ?? 0, 'options.pkeyIndex', 0, 0xffff), portNum: this.port, qkey: integer(o.qkey ?? 0x11111111, 'options.qkey', 0, 0xffffffff) })
    this.#modify('RTR', {})
    this.#modify('RTS', { sqPsn: this.psn })
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
    if (state === 'RESET') this.#error = undefined
  }

  /** @internal rdma_cm moved the QP to this state. */
  markState(state: QpStateName): void {
    this.#setState(state)
  }

  #setState(state: QpStateName): void {
    this.#state = state
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
    return new Promise((resolve, reject) => {
      try {
        const wait = waitOptions(options)
        if (this.srq) throw new RdmaError('This QP receives through its SRQ: use srq.recv()', { code: 'ERR_QP_SRQ' })
        const { sges, regions } = localSges(local, 'local', this.caps.maxRecvSge, this.pd)
        this.#submit('recv', 'recv', 1, regions, wait, resolve, reject, this.#receiveCompletion, (first, enc) => enc.addRecv(first, sges))
      } catch (error) {
        reject(error)
      }
    })
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
    if (!Array.isArray(locals)) throw typeError('an array of receive buffers (each a LocalSlice or an array of them)', 'locals', locals)
    const wait = waitOptions(options)
    if (this.srq) throw new RdmaError('This QP receives through its SRQ: use srq.recvMany()', { code: 'ERR_QP_SRQ' })
    const buffers = locals.map((local, i) => localSges(local, `locals[${i}]`, this.caps.maxRecvSge, this.pd))
    if (buffers.length === 0) return []
    const receives = new ReceiveBatch<ReceiveCompletion>(buffers)
    this.#reserve('recv', 'recv', buffers.length, wait, receives.rejectAll,
      (left) => receives.post(this, this.#ledger.recv, this.#wrIds, this.#encoder, left, this.#receiveCompletion, (words, count) => this.handle.postRecv(words, count)),
      'locals.length')
    return receives.promises
  }

  /** Atomic compare-and-swap on 8 remote bytes; resolves with the value before the operation. */
  compareAndSwap(remote: RemoteSlice, compare: bigint, swap: bigint, options: AtomicOptions = NO_OPTIONS): Promise<bigint> {
    if (options === NO_OPTIONS) {
      const fast = this.#fastAtomic(TAGGED_CMP_SWAP, remote, compare, swap)
      if (fast !== undefined) return fast
    }
    return this.#atomic('compareAndSwap', WrOpcode.AtomicCmpAndSwp, remote, compare, 'compare', swap, 'swap', options)
  }

  /** Atomic fetch-and-add on 8 remote bytes; resolves with the value before the addition. */
  fetchAndAdd(remote: RemoteSlice, add: bigint, options: AtomicOptions = NO_OPTIONS): Promise<bigint> {
    if (options === NO_OPTIONS) {
      const fast = this.#fastAtomic(TAGGED_FETCH_ADD, remote, add, 0n)
      if (fast !== undefined) return fast
    }
    return this.#atomic('fetchAndAdd', WrOpcode.AtomicFetchAndAdd, remote, add, 'add', 0n, undefined, options)
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
    const tagged = this.#tagged
    if (handler === undefined) {
      if (tagged !== undefined && tagged.inFlight > 0) throw handlerBusy(tagged.inFlight)
      this.#tagged = undefined
    } else if (tagged !== undefined) {
      tagged.handler = handler
    } else {
      this.#tagged = new TaggedOps(this, handler, this.#sendSlots.capacity, this.sendCq[CQ_DISPATCH])
    }
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

  // A tagged WRITE or READ, and a tagged atomic: two functions, so that V8
  // optimizes each with its own inlining budget (one function for both left
  // the atomic's helpers as calls once both kinds had run: ~0.4k
  // instructions per fetch-and-add).
  #postTagged(verbIndex: number, local: LocalSlice, remote: RemoteSlice, tag: number): void {
    const tagged = this.#tagged
    if (tagged === undefined || !(local instanceof LocalSlice) || !(remote instanceof RemoteSlice) || !isU32(tag)) {
      throw this.#taggedArgumentError(verbIndex, local, remote, tag)
    }
    const region = local.region
    region.assertUsable()
    if (region.pd !== this.pd) throw wrongPd('local')
    const length = local.length
    if (remote.length !== length || (verbIndex === TAGGED_WRITE ? this.type === 'UD' : this.type !== 'RC') ||
      (length > this.#maxMessage && this.#overMaxMessage(length))) {
      throw this.#taggedArgumentError(verbIndex, local, remote, tag)
    }
    this.#postTaggedNow(tagged, verbIndex, local, remote, tag, 0n, 0, 0n, 0)
  }

  #postTaggedAtomic(verbIndex: number, local: LocalSlice, remote: RemoteSlice, tag: number, first: bigint, second: bigint): void {
    const tagged = this.#tagged
    if (tagged === undefined || !(local instanceof LocalSlice) || !(remote instanceof RemoteSlice) || !isU32(tag)) {
      throw this.#taggedArgumentError(verbIndex, local, remote, tag)
    }
    const region = local.region
    region.assertUsable()
    if (region.pd !== this.pd) throw wrongPd('local')
    if (local.length !== 8 || remote.length !== 8) throw this.#taggedArgumentError(verbIndex, local, remote, tag)
    // smallU64(): the operand below 2^32 as a number, else -1
    const compareAddSmall = smallU64(first, verbIndex === TAGGED_FETCH_ADD ? 'add' : 'compare')
    const swapSmall = verbIndex === TAGGED_CMP_SWAP ? smallU64(second, 'swap') : 0
    if (this.type !== 'RC') throw this.#taggedArgumentError(verbIndex, local, remote, tag)
    this.#postTaggedNow(tagged, verbIndex, local, remote, tag, first, compareAddSmall, second, swapSmall)
  }

  /** Posts a tagged request whose arguments were checked: a send slot and CQ credit now, or it throws (it never waits). */
  #postTaggedNow(tagged: TaggedOps, verbIndex: number, local: LocalSlice, remote: RemoteSlice, tag: number,
    compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): void {
    if (!this.#takeSendSlotNow()) throw this.#cannotPostNow(TAGGED_VERBS[verbIndex]!)
    if (this.#sendBatch.count !== 0) this.#flushSends() // the send queue keeps call order
    const wrId = tagged.add(local.region, tag, verbIndex)
    const refused = this.#postOne(wrId, verbIndex, local, remote, compareAdd, compareAddSmall, swap, swapSmall)
    if (refused !== undefined) {
      tagged.remove(wrId)
      throw refused
    }
  }

  /**
   * Why a tagged post's arguments (or the QP) refuse it, in the order the
   * checks are documented; out of line, so that the hot path stays small
   * enough for V8 to inline what it calls.
   */
  #taggedArgumentError(verbIndex: number, local: unknown, remote: unknown, tag: unknown): Error {
    const verb = TAGGED_VERBS[verbIndex]!
    if (this.#tagged === undefined) {
      this.assertOpen()
      return new RdmaError(`Cannot post a tagged ${verb}: set a completion handler first (qp.setCompletionHandler())`, { code: 'ERR_NO_HANDLER', verb, qpn: this.qpn })
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
    if (verbIndex === TAGGED_WRITE ? this.type === 'UD' : this.type !== 'RC') {
      return new RdmaError(`${verb} needs ${verbIndex === TAGGED_WRITE ? 'a connected QP (RC or UC)' : 'an RC QP'}`, { code: 'ERR_QP_TYPE', verb, qpn: this.qpn })
    }
    if (length > this.#maxMessage) {
      return new RdmaError(`Cannot ${verb} ${length} bytes in one tagged request: at most ${this.#maxMessage} (the port's max message size); qp.${verb}() splits`, { code: 'ERR_MESSAGE_TOO_LARGE', verb, qpn: this.qpn })
    }
    return new Error(`internal: no reason found to refuse a tagged ${verb}`) // a check above and the hot path disagree
  }

  /**
   * Posts one signaled WRITE, READ or atomic recorded in a ring (its send slot
   * and CQ credit taken), from the single-request buffer bound once to the
   * native post function; polls in the same native call when it may, since
   * the device often completes the request inside the post. Returns the
   * error the provider refused it with (the caller then takes the request out
   * of its ring), else undefined.
   */
  #postOne(wrId: number, verbIndex: number, local: LocalSlice, remote: RemoteSlice,
    compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): RdmaError | undefined {
    this.#ledger.send.addPending(this)
    const single = this.#single
    const encoder = single.encoder
    if (local.length !== 0) {
      encoder.setOnly(wrId, TAGGED_OPCODES[verbIndex]!, local, remote)
      if (verbIndex >= TAGGED_FETCH_ADD) encoder.setAtomicOperands(0, compareAdd, compareAddSmall, swap, swapSmall)
    } else { // a zero-length WRITE or READ: no SGE
      encoder.reset()
      encoder.addOne(wrId, TAGGED_OPCODES[verbIndex]!, SendFlags.Signaled, 0, 0, 0, remote.addrLo, remote.addrHi, remote.rkey, 0)
    }
    const cq = this.sendCq
    const poll = cq.mayPollInline()
    const words = encoder.buffer
    if (single.bound !== words) { // first use: bind the buffer once
      single.postPoll = this.handle.sendPoster(words, cq.handle, SEND_POSTER_ONE_POLL)
      single.post = this.handle.sendPoster(words, cq.handle, SEND_POSTER_ONE)
      single.bound = words
    }
    let polled = 0
    try {
      if (poll) {
        const count = this.#sendCountWord
        count[0] = 0 // no poll happens if the CQ was closed meanwhile: never a stale count
        single.postPoll!()
        polled = count[0]!
      } else {
        single.post!()
      }
    } catch (cause) {
      return fromNative(cause) as RdmaError
    }
    if (poll) cq.polledAfterPost(polled)
    else cq.pollAfterDispatch() // posted from a handler: polled for when that dispatch ends
    return undefined
  }

  /** ERR_QP_STATE: the QP's state does not allow posting to `queue`. */
  #wrongState(verb: string, queue: 'send' | 'recv'): RdmaError {
    const needs = queue === 'send' ? 'needs RTS: connect() first' : 'needs INIT or later'
    return new RdmaError(`Cannot ${verb}: QP ${this.qpn} is in state ${this.#state} (${needs})`, { code: 'ERR_QP_STATE', verb, qpn: this.qpn })
  }

  /** Why #takeSendSlotNow() refused, as the error a tagged post throws. */
  #cannotPostNow(verb: string): RdmaError {
    if (!this.#open) return closedError(this.kind)
    if (this.#error) return this.#stateError(verb)
    if (this.#state !== 'RTS') {
      return this.#wrongState(verb, 'send')
    }
    const slots = this.#sendSlots
    if (slots.used < slots.capacity && this.sendCq.credits.used < this.sendCq.credits.capacity) {
      return new RdmaError(`Cannot ${verb}: promise requests wait for the send queue before this one`, { code: 'ERR_QUEUE_FULL', verb, qpn: this.qpn })
    }
    if (slots.used >= slots.capacity) {
      return new RdmaError(`Cannot ${verb}: the send queue is full (${slots.capacity} requests in flight); post again after a completion`, { code: 'ERR_QUEUE_FULL', verb, qpn: this.qpn })
    }
    return new RdmaError(`Cannot ${verb}: the completion queue is full (${this.sendCq.credits.capacity} completions promised); post again after a completion`, { code: 'ERR_CQ_FULL', verb, qpn: this.qpn })
  }

  /** @internal RingOwner: a request of a ring (tagged or the promises' fast path) finished: completed, refused or abandoned. */
  ringRequestFinished(): void {
    this.#sendSlots.release(1)
    this.#ledger.send.give(1)
    this.#ledger.send.removePending()
  }

  /**
   * Posts many work requests with one native call (one doorbell). With
   * completions 'last' only the final request is signaled; the promise
   * resolves when all have completed, or rejects with the first failure.
   */
  postBatch(operations: readonly BatchOperation[], options: BatchOptions = {}): Promise<void> {
    return new Promise((resolve, reject) => {
      try {
        if (!Array.isArray(operations) || operations.length === 0) throw typeError('a non-empty array of operations', 'operations', operations)
        const o = options === NO_OPTIONS ? NO_OPTIONS : optionalObject(options, 'options')
        const wait = o === NO_OPTIONS ? NO_OPTIONS : waitOptions(o)
        const mode = o.completions === undefined ? 'last' : oneOf(o.completions, 'options.completions', ['last', 'each'] as const, 'last')
        const baseFlags = (o.fence ? SendFlags.Fence : 0) | (o.solicited ? SendFlags.Solicited : 0)
        if (this.#simpleBatch(operations, wait, mode, baseFlags, resolve, reject)) return
        const wrs = operations.map((op, i) => {
          // Argument names are only built when a check fails.
          const record = typeof op === 'object' && op !== null && !Array.isArray(op) ? op as unknown as Record<string, unknown> : object(op, opNameOf(i))
          const kind = record.op === 'write' || record.op === 'read' || record.op === 'send' || record.op === 'compareAndSwap' || record.op === 'fetchAndAdd' ? record.op
            : oneOf(record.op, `${opNameOf(i)}.op`, ['write', 'read', 'send', 'compareAndSwap', 'fetchAndAdd'] as const)
          if (kind === 'compareAndSwap' || kind === 'fetchAndAdd') return this.#batchAtomicWr(kind, record, i, baseFlags)
          return this.#sendWr(kind, record.local, record.remote, record, i, baseFlags)
        })
        const regions = wrs.flatMap((w) => w.regions)
        // Writes and reads over the max message size become several requests.
        const requests = wrs.flatMap(({ wr, length }) => length > this.#maxMessage && this.#overMaxMessage(length) ? splitWr(wr, length, this.#maxMessage) : [wr])
        const verb = operations.length === 1 ? operations[0]!.op : 'batch'
        // 'each' signals every request (one completion each); the promise
        // still settles once, on the last completion or the first failure.
        this.#submit('send', verb, requests.length, regions, wait, resolve, reject, noResult, (first, enc) => {
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
   * The hot path of postBatch(): every operation a write or read of one slice
   * with no immediate or inline data, none empty or over the max message size.
   * Each is checked as #sendWr checks it, and the batch is encoded straight into
   * the send buffer by one call (no work request objects). Each distinct region
   * is held once. Returns false (nothing done) when an operation is
   * not that simple or fails a check: the general path then says why.
   */
  #simpleBatch(operations: readonly BatchOperation[], wait: WaitOptions, mode: 'last' | 'each', baseFlags: number,
    resolve: () => void, reject: (error: Error) => void): boolean {
    const n = operations.length
    const locals: LocalSlice[] = new Array(n)
    const remotes: RemoteSlice[] = new Array(n)
    const reads: number[] = new Array(n)
    const maxMessage = this.#maxMessage
    const readable = this.type === 'RC'
    const writable = this.type !== 'UD'
    // The distinct regions, held once each: a batch usually names one.
    let firstRegion: MemoryRegion | undefined
    let regions: MemoryRegion[] | undefined
    for (let i = 0; i < n; i++) {
      const op = operations[i] as { op?: unknown; local?: unknown; remote?: unknown; immediate?: unknown; inline?: unknown }
      if (typeof op !== 'object' || op === null) return false
      const local = op.local
      const remote = op.remote
      const read = op.op === 'read'
      if (!(read ? readable : op.op === 'write' && writable) || !(local instanceof LocalSlice) || !(remote instanceof RemoteSlice) ||
        op.immediate !== undefined || (op.inline !== undefined && op.inline !== false)) return false
      const length = local.length
      if (remote.length !== length || length === 0 || length > maxMessage) return false
      const region = local.region
      if (region !== firstRegion) {
        if (region.pd !== this.pd || !region.usable) return false // the general path says why
        if (firstRegion === undefined) firstRegion = region
        else if (regions === undefined) regions = [firstRegion, region]
        else if (!regions.includes(region)) regions.push(region)
      }
      locals[i] = local
      remotes[i] = remote
      reads[i] = read ? 1 : 0
    }
    const verb = n === 1 ? (reads[0] === 1 ? 'read' : 'write') : 'batch'
    const signalEach = mode === 'each'
    this.#submit('send', verb, n, regions ?? firstRegion!, wait, resolve, reject, noResult,
      (first, enc) => enc.addRdmaColumns(first, n, locals, remotes, reads, baseFlags, signalEach))
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
  postEncoded(verb: 'write' | 'read', count: number, regions: readonly MemoryRegion[],
    encode: (firstWrId: number, enc: WorkRequestEncoder) => void): Promise<void> {
    return new Promise((resolve, reject) => {
      try {
        if (verb === 'read' && this.type !== 'RC') throw new RdmaError('read needs an RC QP', { code: 'ERR_QP_TYPE' })
        for (const region of regions) {
          if (region.pd !== this.pd) throw wrongPd('regions')
          region.assertUsable()
        }
        this.#submit('send', count === 1 ? verb : 'batch', count, regions, NO_OPTIONS, resolve, reject, noResult, encode)
      } catch (error) {
        reject(error)
      }
    })
  }

  /** An atomic of a batch: its old value lands in `local` (8 bytes of a region of this PD). */
  #batchAtomicWr(kind: 'compareAndSwap' | 'fetchAndAdd', record: Record<string, unknown>, index: number, baseFlags: number): { wr: SendWr; regions: MemoryRegion; length: number } {
    const name = opNameOf(index)
    if (this.type !== 'RC') throw new RdmaError(`${kind} needs an RC QP`, { code: 'ERR_QP_TYPE' })
    const local = instance(record.local, `${name}.local`, LocalSlice)
    if (local.length !== 8) throw rangeError('a local slice of 8 bytes', `${name}.local.length`, local.length)
    local.region.assertUsable()
    if (local.region.pd !== this.pd) throw wrongPd(`${name}.local`)
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
   * Binds a memory window over part of a region (the region needs
   * Access.MwBind) and resolves with a descriptor of the window for the peer.
   */
  bindWindow(window: MemoryWindow, slice: LocalSlice, access: number, options: WaitOptions = {}): Promise<{ version: 1; addr: string; rkey: number; length: number }> {
    return new Promise((resolve, reject) => {
      try {
        instance(window, 'window', MemoryWindow)
        if (!(slice instanceof LocalSlice)) throw typeError('a LocalSlice', 'slice', slice)
        slice.region.assertUsable()
        integer(access, 'access', 0, 0xffffffff)
        const wait = waitOptions(options)
        if (this.type === 'UD') throw new RdmaError('bindWindow needs a connected QP (RC or UC)', { code: 'ERR_QP_TYPE' })
        if (window.binding) throw new RdmaError('A bind of this memory window is in flight: wait for it before binding again', { code: 'ERR_BUSY' })
        // The device takes the new rkey only if the bind completes: until then
        // the window keeps the rkey it had (type 1 binds change it at post).
        const before = window.handle.rkey
        window.binding = true
        try {
          this.#bindSubmit(window, before, slice, access, wait, resolve, reject)
        } catch (error) {
          window.binding = false
          throw error
        }
      } catch (error) {
        reject(error)
      }
    })
  }

  /** Posts the bind; the window's rkey changes only when it completes. */
  #bindSubmit(window: MemoryWindow, before: number, slice: LocalSlice, access: number, wait: WaitOptions,
    resolve: (value: { version: 1; addr: string; rkey: number; length: number }) => void, reject: (error: Error) => void): void {
    let rkey = 0
    this.#submit('send', 'bindWindow', 1, [slice.region], wait, resolve,
      (error) => {
        window.binding = false
        if (!window.closed) window.handle.setRkey(before)
        reject(error)
      },
      () => {
        window.binding = false
        if (!window.closed) window.handle.setRkey(rkey)
        window.boundRkey = rkey
        window.bound = true
        return { version: 1 as const, addr: '0x' + slice.address.toString(16), rkey, length: slice.length }
      },
      (first) => {
        rkey = this.handle.bindMemoryWindow(window.handle, slice.region.handle, slice.address, slice.length, access, first >>> 0, Math.floor(first / 4294967296), SendFlags.Signaled)
      }, true)
  }

  /**
   * The type 2 window that `rkey` names (this process's, on this kernel
   * device), marked unbound from this post on (a second invalidation is
   * refused); refused if there is none, if a bind of it is in flight, or if
   * it is not bound now. Soft-RoCE on Linux 6.1 dereferences NULL in the
   * kernel for a LOCAL_INV of an unbound type 2 window, and the spec makes it
   * an error. (A type 1 window's rkey is posted: the device refuses it.)
   */
  #windowToInvalidate(rkey: number): MemoryWindow | undefined {
    const window = this.pd.device.windowWithRkey(rkey)
    // An rkey of no window this process knows may still name an unbound window (of another
    // process, or closed here but not yet freed): refused, as the kernel would crash on it.
    if (window === undefined) {
      throw new RdmaError(`Cannot invalidate rkey ${rkey}: it names no memory window of this process on this device`, {
        code: 'ERR_WINDOW_NOT_BOUND', verb: 'invalidate', qpn: this.qpn,
      })
    }
    if (window.type !== 2) return undefined // the device refuses it with a completion error
    // While a bind is in flight the library cannot know what the device will hold: a LOCAL_INV
    // then could unbind a window it still counts as bound, and the next one would crash the kernel.
    if (window.binding) {
      throw new RdmaError(`Cannot invalidate rkey ${rkey}: a bind of its memory window is in flight; wait for it first`, {
        code: 'ERR_BUSY', verb: 'invalidate', qpn: this.qpn,
      })
    }
    if (!window.bound) {
      throw new RdmaError(`Cannot invalidate rkey ${rkey}: its memory window is not bound (never bound, or already invalidated)`, {
        code: 'ERR_WINDOW_NOT_BOUND', verb: 'invalidate', qpn: this.qpn,
      })
    }
    window.bound = false
    return window
  }

  /** LOCAL_INV: invalidates a type 2 memory window's rkey on this device. */
  invalidate(rkey: number, options: WaitOptions = {}): Promise<void> {
    return new Promise((resolve, reject) => {
      try {
        integer(rkey, 'rkey', 0, 0xffffffff)
        if (this.type === 'UD') throw new RdmaError('invalidate needs a connected QP (RC or UC)', { code: 'ERR_QP_TYPE' })
        const wait = waitOptions(options)
        const window = this.#windowToInvalidate(rkey)
        this.#submit('send', 'invalidate', 1, [], wait, () => resolve(), (error) => {
          if (window !== undefined && !window.closed) window.bound = true // refused: the window keeps its bind
          reject(error)
        }, () => undefined, (first, enc) => {
          enc.addSend({ wrId: first, opcode: WrOpcode.LocalInv, flags: SendFlags.Signaled, sges: [], immOrRkey: rkey })
        })
      } catch (error) {
        reject(error)
      }
    })
  }

  #atomic(verb: string, opcode: number, remote: RemoteSlice, first: unknown, firstName: string, second: unknown, secondName: string | undefined,
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
          if (local.region.pd !== this.pd) throw wrongPd('options.local')
        } else {
          local = this.pd.takeAtomicSlot()
          owned = true
        }
        const pd = this.pd
        let wrId = 0 // set once the request has its wr_id (it may be posted)
        const giveBack = (): void => { // at most once: a slot in the free list twice would be shared
          if (owned) pd.returnAtomicSlot(local)
          owned = false
        }
        const done = (): void => { // the entry is not kept: the value is read from the slot
          const value = readAtomicValue(local)
          giveBack()
          resolve(value)
        }
        const failed = (error: Error): void => {
          // After a timeout or abort of a posted request (it has a wr_id) the device may still write the slot.
          const code = (error as RdmaError).code
          if (wrId === 0 || (code !== 'ETIMEDOUT' && code !== 'ABORT_ERR')) giveBack()
          reject(error)
        }
        if (wait === NO_OPTIONS && this.#takeSendSlotNow()) {
          // The hot path: written straight into the send buffer, no work request object.
          wrId = this.#wrIds.take(1)
          const pending = new Pending(this, this.#ledger.send, 'send', verb, wrId, wrId, local.region, done, failed)
          const batch = this.#sendBatch
          const at = batch.encoder.addOne(wrId, opcode, SendFlags.Signaled, local.address, 8, local.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
          batch.encoder.setAtomicOperands(at, compareAdd, compareAddSmall, swap, swapSmall)
          pending.wordStart = at
          return this.#queueSend(batch, pending, 1, NO_OPTIONS)
        }
        const wr: SendWr = {
          wrId: 0, opcode, flags: SendFlags.Signaled, sges: [{ address: local.address, length: 8, lkey: local.lkey }],
          remoteHi: remote.addrHi, remoteLo: remote.addrLo, rkey: remote.rkey, compareAdd, swap,
        }
        try {
          this.#submit('send', verb, 1, local.region, wait, done, (error) => { wrId = wr.wrId; failed(error) }, undefined, wr)
        } catch (error) {
          giveBack() // refused before it was posted
          throw error
        }
      } catch (error) {
        reject(error)
      }
    })
  }

  /**
   * The hot path of fetchAndAdd() and compareAndSwap(): default options, the
   * first send of a turn, a slot and credit free now, operands that check.
   * The value lands in a library-owned slot. Anything else returns undefined
   * and takes the general path, which checks the same things and says why.
   */
  #fastAtomic(verbIndex: number, remote: RemoteSlice, first: unknown, second: unknown): Promise<bigint> | undefined {
    if (this.#turnOpen || !(remote instanceof RemoteSlice) || remote.length !== 8 || this.type !== 'RC') return undefined
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
      local = this.pd.takeAtomicSlot() // may register a page of slots: a failure is the general path's to report
    } catch {
      return undefined
    }
    if (!this.#takeSendSlotNow()) {
      this.pd.returnAtomicSlot(local)
      return undefined
    }
    const promise = this.#promised.addAtomic(local, true, verbIndex)
    this.#postNow(this.#promised.lastWrId, verbIndex, local, remote, first as bigint, compareAddSmall, verbIndex === TAGGED_CMP_SWAP ? second as bigint : 0n, swapSmall)
    return promise
  }

  /**
   * Validates one write/read/send and builds its work request. Hot path:
   * argument names for messages are only built when a check fails.
   */
  #sendWr(kind: 'write' | 'read' | 'send', local: unknown, remote: unknown, o: Record<string, unknown>, index: number, baseFlags: number): { wr: SendWr; regions: MemoryRegion | MemoryRegion[]; length: number } {
    let sges: Sge[]
    let regions: MemoryRegion | MemoryRegion[]
    let length: number
    if (local instanceof LocalSlice) { // the common case: one slice
      const region = local.region
      region.assertUsable()
      if (region.pd !== this.pd) throw wrongPd(localNameOf(index))
      length = local.length
      sges = length > 0 ? [{ address: region.address + local.offset, length, lkey: region.lkey }] : []
      regions = region
    } else {
      ({ sges, regions, length } = localSges(local, localNameOf(index), this.caps.maxSendSge, this.pd))
    }
    let flags = baseFlags
    if (o.inline !== undefined && o.inline !== false) {
      boolean(o.inline, `${opNameOf(index)}.inline`, false)
      if (kind === 'read') throw typeError('no inline flag on a read', `${opNameOf(index)}.inline`, true)
      if (length > this.caps.maxInlineData) throw rangeError(`at most ${this.caps.maxInlineData} bytes inline (maxInlineData)`, localNameOf(index), length)
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
      if (length > this.#maxMessage && this.#overMaxMessage(length)) { // a message cannot be split
        throw new RdmaError(`Cannot send ${length} bytes: a message holds at most ${this.#maxMessage} (the port's max message size)`, { code: 'ERR_MESSAGE_TOO_LARGE', verb: kind, qpn: this.qpn })
      }
      if (this.type === 'UD') {
        const dest = object(o.dest, `${opNameOf(index)}.dest`)
        const ah = instance(dest.ah, `${opNameOf(index)}.dest.ah`, AddressHandle)
        // Checked now: found while posting a gathered batch, it would fail the wrong request.
        if (ah.closed) throw closedError('AddressHandle')
        wr.ahId = ah.id
        wr.remoteQpn = integer(dest.qpn, `${opNameOf(index)}.dest.qpn`, 0, 0xffffff)
        wr.remoteQkey = integer(dest.qkey, `${opNameOf(index)}.dest.qkey`, 0, 0xffffffff)
      }
    } else {
      if (this.type === 'UD') throw new RdmaError(`${kind} needs a connected QP (RC or UC)`, { code: 'ERR_QP_TYPE' })
      if (kind === 'read' && this.type !== 'RC') throw new RdmaError('read needs an RC QP', { code: 'ERR_QP_TYPE' })
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
        const { wr, regions, length } = this.#sendWr(kind, local, remote, o, -1, flags)
        if (length > this.#maxMessage && this.#overMaxMessage(length)) {
          // Over the max message size: several requests, posted together, the last signaled.
          this.#split(kind, splitWr(wr, length, this.#maxMessage), regions, wait, resolve, reject)
        } else {
          this.#submit('send', kind, 1, regions, wait, resolve, reject, noResult, wr)
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
    if (!this.#takeSendSlotNow()) return undefined
    const verbIndex = kind === 'read' ? TAGGED_READ : TAGGED_WRITE
    if (!this.#turnOpen) {
      const promise = this.#promised.add(region, verbIndex)
      this.#postNow(this.#promised.lastWrId, verbIndex, local, remote, 0n, 0, 0n, 0)
      return promise
    }
    const wrId = this.#wrIds.take(1)
    let pending: Pending
    const promise = new Promise<void>((resolve, reject) => {
      pending = new Pending(this, this.#ledger.send, 'send', kind, wrId, wrId, region, resolve, reject, noResult)
    })
    const batch = this.#sendBatch
    pending!.wordStart = batch.encoder.addOne(wrId, TAGGED_OPCODES[verbIndex]!, SendFlags.Signaled,
      region.address + local.offset, length, region.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
    this.#queueSend(batch, pending!, 1, NO_OPTIONS)
    return promise
  }

  /**
   * The promises' fast path: the first send of a turn, recorded in the
   * #promised ring, is posted at once (sends gathered earlier go first), and
   * the turn opens: the sends that follow in it are gathered and posted
   * together. (Leaving the turn closed when the device completed the request
   * inside its post saved the microtask, ~0.2k instructions, but posted 16
   * fetch-and-adds in flight one by one: 14-33% fewer per second on rxe.)
   */
  #postNow(wrId: number, verbIndex: number, local: LocalSlice, remote: RemoteSlice,
    compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): void {
    if (this.#sendBatch.count !== 0) this.#flushSends() // the send queue keeps call order
    this.#turnOpen = true
    void RESOLVED.then(this.#closeTurn)
    const refused = this.#postOne(wrId, verbIndex, local, remote, compareAdd, compareAddSmall, swap, swapSmall)
    if (refused !== undefined) this.#promised.refuse(wrId, refused)
  }

  /**
   * For the hot paths: takes one send slot and one CQ credit if the QP can
   * post now and both are free without waiting (else takes nothing: the
   * general path then waits for them, or says why it cannot post).
   */
  #takeSendSlotNow(): boolean {
    if (this.#error !== undefined || this.#state !== 'RTS' || !this.#open) return false
    const slots = this.#sendSlots
    if (!slots.tryTake(1)) return false
    if (!this.sendCq.credits.tryTake(1)) {
      slots.release(1)
      return false
    }
    this.#ledger.send.credits++
    return true
  }

  /**
   * Posts the pieces of a split write or read. Pieces that fit the send queue
   * and the CQ go out together; more are posted in rounds of half of that
   * (each round's last piece signaled), so a 10 GB write works on a queue of
   * 128. Rounds queue for slots in order; the promise settles once: when the
   * last round completes, or with the first failure.
   */
  #split(kind: string, pieces: SendWr[], regions: MemoryRegion | readonly MemoryRegion[], wait: WaitOptions,
    resolve: () => void, reject: (error: Error) => void): void {
    const fits = Math.min(this.#sendSlots.capacity, this.sendCq.credits.capacity)
    const round = pieces.length <= fits ? pieces.length : Math.max(1, fits >> 1)
    let rounds = Math.ceil(pieces.length / round)
    const roundDone = (): void => { if (--rounds === 0) resolve() }
    for (let at = 0; at < pieces.length; at += round) {
      const part = pieces.slice(at, at + round)
      part[part.length - 1]!.flags |= SendFlags.Signaled
      this.#submit('send', kind, part.length, regions, wait, roundDone, reject, noResult, (first, enc) => {
        part.forEach((piece, i) => { piece.wrId = first + i; enc.addSend(piece) })
      })
    }
  }

  /**
   * Common path of every operation: checks the QP, waits for queue slots,
   * tracks the request, encodes it and posts it with one native call.
   * `encode` is either a prepared send WR (its wrId is filled in) or a
   * function that encodes the requests from the first wr_id.
   */
  #submit<T>(queue: 'send' | 'recv', verb: string, count: number, regions: MemoryRegion | readonly MemoryRegion[], wait: WaitOptions,
    resolve: (value: T) => void, reject: (error: Error) => void, transform: ((entry: CompletionEntry) => T) | undefined,
    encode: SendWr | ((firstWrId: number, enc: WorkRequestEncoder) => void), custom = false): void {
    this.#reserve(queue, verb, count, wait, reject,
      (left) => this.#post(queue, verb, count, regions, left, resolve, reject, transform, encode, custom))
  }

  /**
   * Checks that `count` work requests can go to `queue` (throws why not), then
   * takes their queue slots and CQ credits and calls `post` with what is left
   * of the wait: now, or once they are free (`reject` when the wait ends
   * first, or the QP closed or failed meanwhile).
   */
  #reserve(queue: 'send' | 'recv', verb: string, count: number, wait: WaitOptions, reject: (error: Error) => void,
    post: (wait: WaitOptions) => void, countName = 'operations.length'): void {
    this.assertOpen()
    if (this.#error) throw this.#stateError(verb)
    if (queue === 'send' ? this.#state !== 'RTS' : this.#state === 'RESET') {
      throw this.#wrongState(verb, queue)
    }
    const slots = queue === 'send' ? this.#sendSlots : this.#recvSlots
    const credits = (queue === 'send' ? this.sendCq : this.recvCq).credits
    if (count > slots.capacity) throw rangeError(`at most ${slots.capacity} work requests (the queue depth)`, countName, count)
    if (count > credits.capacity) {
      throw new RdmaError(`Cannot ${verb}: ${count} work requests can never fit the ${credits.capacity} entries of the completion queue`, { code: 'ERR_CQ_TOO_SMALL', verb, qpn: this.qpn })
    }
    if (wait.signal?.aborted) throw abortError(verb, this.qpn, wait.signal)
    // Take the queue's slots, then the CQ's credits; wait (bounded by the
    // request's timeout and signal) for what is not free now.
    const reserved = (left: WaitOptions): void => {
      // The slots and credits are taken: #unreserve or Pending.finish gives them back.
      (queue === 'send' ? this.#ledger.send : this.#ledger.recv).credits += count
      if (this.closed || this.#error) { // closed or failed while it waited
        this.#unreserve(queue, count)
        return reject(this.closed ? closedError(this.kind) : this.#stateError(verb))
      }
      post(left)
    }
    let taken = 0
    if (slots.tryTake(count)) {
      if (credits.tryTake(count)) return reserved(wait)
      taken = 1
    }
    new SlotWait([slots, credits], taken, count, this, wait, verb, this.qpn, reserved, reject).start()
  }

  /** Gives back the slots and credits of a request that was not posted. */
  #unreserve(queue: 'send' | 'recv', count: number): void {
    if (queue === 'send') {
      this.#sendSlots.release(count)
      this.#ledger.send.give(count)
    } else {
      this.#recvSlots.release(count)
      this.#ledger.recv.give(count)
    }
  }

  #post<T>(queue: 'send' | 'recv', verb: string, count: number, regions: MemoryRegion | readonly MemoryRegion[], wait: WaitOptions,
    resolve: (value: T) => void, reject: (error: Error) => void, transform: ((entry: CompletionEntry) => T) | undefined,
    encode: SendWr | ((firstWrId: number, enc: WorkRequestEncoder) => void), custom: boolean): void {
    const ledger = queue === 'send' ? this.#ledger.send : this.#ledger.recv
    const first = this.#wrIds.take(count)
    const pending = new Pending(this, ledger, queue, verb, first, first + count - 1, regions, resolve, reject, transform)
    if (queue === 'send' && !custom) {
      // Sends made in the same turn of the event loop are posted together, with
      // one native call (one doorbell).
      const batch = this.#sendBatch
      const wordStart = batch.encoder.used
      try {
        if (typeof encode === 'function') {
          encode(first, batch.encoder)
        } else {
          encode.wrId = first
          batch.encoder.addSend(encode)
        }
      } catch (error) {
        batch.encoder.truncate(wordStart, batch.wrs)
        this.#unreserve(queue, count)
        return reject(error as Error)
      }
      pending.wordStart = wordStart
      return this.#queueSend(batch, pending, count, wait)
    }
    // Receives, and sends that post themselves (memory-window binds).
    const slots = queue === 'send' ? this.#sendSlots : this.#recvSlots
    let encoded = false
    try {
      if (custom) this.#flushSends() // keep the send queue's order
      const encoder = this.#encoder
      encoder.reset()
      pending.track(wait)
      if (typeof encode === 'function') {
        encode(first, encoder)
      } else {
        encode.wrId = first
        encoder.addSend(encode)
      }
      encoded = true
      if (!custom) this.handle.postRecv(encoder.buffer, encoder.count)
    } catch (cause) {
      const error = encoded || custom ? fromNative(cause) : (cause as Error)
      this.#refused(pending, count, error, slots)
      return
    }
    // Posted: settle it now if the device already completed it.
    if (queue === 'send') this.sendCq.pollAfterPost()
  }

  /** Tracks an encoded send and posts it now (the first of a turn, or inline data) or with the rest of the turn. */
  #queueSend(batch: SendBatch, pending: Pending, count: number, wait: WaitOptions): void {
    pending.track(wait)
    batch.pendings[batch.count++] = pending
    batch.wrs += count
    // The first send of a turn is posted at once, so a caller sees it on the
    // wire when the call returns (and may spin on memory for the answer);
    // so is inline data (the caller may reuse its buffer). Sends that follow
    // in the same turn are gathered and posted together after it.
    if (!this.#turnOpen) {
      this.#turnOpen = true
      void RESOLVED.then(this.#closeTurn)
      return this.#flushSends()
    }
    if (batch.encoder.hasInline) return this.#flushSends()
    if (!this.#flushScheduled) {
      this.#flushScheduled = true
      void RESOLVED.then(this.#flushSends)
    }
  }

  /** Posts `count` work requests of the batch from `wordStart` with one native call; with `poll`, polls the send CQ right after. */
  #postFrom(batch: SendBatch, wordStart: number, count: number, poll: number): number {
    const words = batch.encoder.buffer
    if (batch.bound !== words) { // first use, or the encoder grew: bind the (new) buffer once
      batch.post = this.handle.sendPoster(words, this.sendCq.handle)
      batch.bound = words
    }
    return batch.post!(wordStart, count, poll)
  }

  /** Posts the sends gathered this turn; a request the provider refuses fails alone. */
  readonly #flushSends = (): void => {
    this.#flushScheduled = false
    const batch = this.#sendBatch
    const entries = batch.pendings as Pending[] // [0, count) are set
    const length = batch.count
    if (length === 0) return
    // Swap buffers: sends made while this one is posted (e.g. by requests that
    // were waiting for the slots a refused request frees) go to the other.
    this.#sendBatch = this.#spareBatch
    this.#spareBatch = batch
    const total = batch.wrs
    const cq = this.sendCq
    let polled = -1 // completions the post polled; -1: poll separately
    try {
      if (!this.#open) return // closing rejected them already
      const poll = cq.mayPollInline() ? 1 : 0
      let index = 0
      let wrsBefore = 0
      while (index < length) {
        try {
          const n = this.#postFrom(batch, entries[index]!.wordStart, total - wrsBefore, index === 0 ? poll : 0)
          if (index === 0 && poll) polled = n
          break
        } catch (cause) {
          const error = fromNative(cause) as RdmaError
          let posted = error.posted ?? 0
          while (posted >= entries[index]!.slots) { // these reached the queue
            posted -= entries[index]!.slots
            wrsBefore += entries[index]!.slots
            index++
          }
          const bad = entries[index]!
          const badCount = bad.slots
          this.#refused(bad, badCount, error, this.#sendSlots, posted)
          wrsBefore += badCount
          index++
          if (this.#error) { // the QP failed: the rest cannot be posted
            for (const rest of entries.slice(index, length)) this.#refused(rest, rest.slots, this.#stateError(rest.verb), this.#sendSlots, 0)
            break
          }
        }
      }
    } finally {
      for (let i = 0; i < length; i++) batch.pendings[i] = undefined // the batch does not keep them alive
      batch.count = 0
      batch.wrs = 0
      batch.encoder.reset()
    }
    if (polled >= 0) cq.polledAfterPost(polled)
    else cq.pollAfterPost()
  }

  /** A request the provider refused: `posted` of its work requests reached the queue. */
  #refused(pending: Pending, count: number, error: Error, slots: WorkQueueSlots, posted = (error as RdmaError).posted ?? 0): void {
    if (posted === 0) {
      pending.untrack()
    } else {
      // Part of a batch reached the queue; its final, signaled request did
      // not. Flush the posted ones through the error state so they complete.
      slots.release(count - posted)
      ;(slots === this.#sendSlots ? this.#ledger.send : this.#ledger.recv).give(count - posted)
      pending.truncate(posted)
      try { this.#modify('ERR', {}) } catch { /* the QP is failed either way */ }
    }
    pending.reject(error)
  }

  #stateError(verb: string): RdmaError {
    const cause = this.#error!
    return new RdmaError(`Cannot ${verb}: QP ${this.qpn} is in the error state (${cause.status ?? cause.code})`, {
      code: 'ERR_QP_STATE', status: cause.status, verb, qpn: this.qpn, cause,
    } as never)
  }

  /** @internal CompletionOwner: the request of a completion on this QP (an SRQ receive, or a failed unsignaled member of a batch). */
  pendingFor(wrId: number): Pending | TaggedOps | PromiseOps | undefined {
    if (wrId >= PROMISE_WR_ID_BASE) return wrId >= TAGGED_WR_ID_BASE ? this.#tagged : this.#promised
    const pending = this.pendings.get(wrId) ?? this.srq?.pendings.get(wrId)
    if (pending !== undefined) return pending
    return this.pendings.containing(wrId)
  }

  /** @internal PendingOwner */
  released(pending: Pending): void {
    if (pending.queue === 'send') {
      this.#sendSlots.release(pending.slots)
      this.#ledger.send.give(pending.slots)
    } else {
      this.#recvSlots.release(pending.slots)
      this.#ledger.recv.give(pending.slots)
    }
  }

  /** @internal PendingOwner */
  orphaned(_entry: CompletionEntry): void { this.#orphaned++ }

  /** Rejects this QP's requests that wait for a queue slot or CQ credit. */
  #failWaiting(error: Error): void {
    this.#sendSlots.fail(error)
    this.#recvSlots.fail(error)
    this.sendCq.credits.fail(error, this)
    this.recvCq.credits.fail(error, this)
  }

  /** @internal PendingOwner: an error completion moved the QP to the error state. */
  failed(error: RdmaError): void {
    if (this.#error) return
    this.#error = error
    this.#setState('ERR')
    this.#failWaiting(this.#stateError('post'))
  }

  /**
   * @internal CompletionOwner: a CQ of this QP failed, so no completion will
   * come: the QP fails and every request in flight is rejected with `error`
   * (the memory stays in use until the QP is closed).
   */
  failAll(error: RdmaError): void {
    this.failed(error)
    for (const pending of this.pendings.values()) pending.reject(error)
    this.#promised.reportAll(error)
    this.#tagged?.reportAll(error)
  }

  protected override afterClose(): void {
    this.#open = false
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
    // The device is done with every buffer this QP named.
    const error = closedError(this.kind)
    this.#failWaiting(error) // first: the slots abandonAll frees must not let them post
    abandonAll(this.pendings.values(), error)
    this.#promised.abandonAll(error)
    this.#tagged?.abandonAll(error)
  }
}

function pick<T extends object, K extends keyof T>(source: T, ...keys: K[]): Partial<Pick<T, K>> {
  const result: Partial<Pick<T, K>> = {}
  if (typeof source !== 'object' || source === null) return result
  for (const key of keys) if (source[key] !== undefined) result[key] = source[key]
  return result
}
