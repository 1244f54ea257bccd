// A QP's two work queues as the library keeps them: queue slots and CQ
// credits (and waiting for them), the requests in flight (Pending objects by
// wr_id, and the two rings), the sends gathered in one turn of the event loop
// and their flush (with the blame of a partial post), and the single-request
// path. The QP (verbs/queue-pair.ts) checks arguments and builds requests;
// this posts them and settles their bookkeeping.
import { SEND_POSTER_ONE, SEND_POSTER_ONE_POLL, type NativeCompletionQueue, type NativeQueuePair, type PostOneFunction } from '../native/addon.js'
import { closedError, fromNative, RdmaError } from '../core/errors.js'
import type { QpStateName } from '../core/constants.js'
import { SendFlags } from '../core/constants.js'
import { NO_OPTIONS, rangeError, type WaitOptions } from '../core/validate.js'
import { abandonAll, Pending, type CompletionEntry, type PendingOwner } from './pending.js'
import { PendingTable, type PendingIndex } from './pending-table.js'
import { WorkRequestEncoder, type LocalBytes, type RemoteBytes, type SendWr } from './encoder.js'
import { abortError, SlotWait, WorkQueueSlots } from './slots.js'
import { QueueLedger, type LedgerCq } from './queue-ledger.js'
import type { HeldRegion } from './held-region.js'
import { PROMISE_WR_ID_BASE, QP_WR_IDS, TAGGED_WR_ID_BASE, type WrIdAllocator } from './wr-ids.js'
import { PromiseOps, type AtomicSlots, type AtomicTarget } from './promise-ops.js'
import { handlerBusy, TAGGED_FETCH_ADD, TAGGED_OPCODES, TAGGED_VERBS, TaggedOps, type CompletionHandler } from './tagged-ops.js'
import type { CompletionDispatch, CompletionOwner } from './dispatch.js'
import { GatheredSends, RESOLVED } from './send-flush.js'
import { cannotPostNow, stateError, wrongState } from './queue-errors.js'

/** A CQ as the queues use it: credits and waiting requests (the ledger), its native handle, and polling right after a post. */
export interface PostingCq extends LedgerCq {
  readonly handle: NativeCompletionQueue
  mayPollInline(): boolean
  polledAfterPost(n: number): void
  pollAfterPost(): void
  pollAfterDispatch(): void
}

/** What the queues need of their QP. */
export interface QueuesOwner {
  readonly qpn: number
  /** An error completion moved the QP to the error state. */
  failed(error: RdmaError): void
  /** A partial post: flush what reached the queue through the error state. */
  moveToError(): void
  /** A receive completed after its promise timed out or was aborted. */
  orphaned(entry: CompletionEntry): void
}

export type Encode = SendWr | ((firstWrId: number, enc: WorkRequestEncoder) => void)

export class QpQueues<Atomic extends AtomicTarget> implements PendingOwner, CompletionOwner {
  readonly qpn: number
  /** Requests in flight by the wr_id of their last work request (every Pending of this QP is here). */
  readonly pendings: PendingTable
  readonly sendSlots: WorkQueueSlots
  readonly recvSlots: WorkQueueSlots
  readonly send: QueueLedger
  readonly recv: QueueLedger
  /** The promises' fast path: requests in flight and their resolve and reject (no Pending object). */
  readonly promised: PromiseOps<Atomic>
  /** The lower-level completion path (setCompletionHandler()): its requests in flight and their handler. */
  tagged: TaggedOps | undefined
  /** Whether the QP may post sends now (RTS, not failed, open); kept by the QP. */
  sendable = false
  /** Whether a turn's first send was posted: the sends that follow in the turn are gathered. */
  turnOpen = false
  #state: QpStateName = 'RESET'
  #failure: RdmaError | undefined
  #open = true
  readonly #owner: QueuesOwner
  readonly #handle: NativeQueuePair
  readonly #sendCq: PostingCq
  readonly #recvCq: PostingCq
  readonly #sendDispatch: CompletionDispatch
  readonly #srqPendings: PendingIndex | undefined
  readonly #wrIds = QP_WR_IDS
  /** Receives and custom posts are encoded here (used and emptied within one call). */
  readonly #encoder = new WorkRequestEncoder()
  /** The sends gathered in this turn, and their flush (send-flush.ts). */
  readonly #sends: GatheredSends
  readonly #closeTurn = (): void => { this.turnOpen = false }
  // The single-request buffer of the ring requests (tagged, and the promises'
  // fast path): one request at word 0, posted by itself, with the native
  // functions bound to it once (post and poll, post alone).
  readonly #single = new WorkRequestEncoder()
  #singlePostPoll: PostOneFunction | undefined
  #singlePost: PostOneFunction | undefined
  #singleBound: Uint32Array | undefined

  constructor(owner: QueuesOwner, handle: NativeQueuePair, caps: { maxSendWr: number; maxRecvWr: number },
    sendCq: PostingCq, sendDispatch: CompletionDispatch, recvCq: PostingCq, srq: { readonly pendings: PendingIndex } | undefined,
    atomicSlots: AtomicSlots<Atomic>) {
    this.#owner = owner
    this.qpn = owner.qpn
    this.#handle = handle
    this.#sendCq = sendCq
    this.#recvCq = recvCq
    this.#sendDispatch = sendDispatch
    this.#srqPendings = srq?.pendings
    this.pendings = new PendingTable(caps.maxSendWr + caps.maxRecvWr)
    this.sendSlots = new WorkQueueSlots(caps.maxSendWr)
    this.recvSlots = new WorkQueueSlots(srq ? 0 : caps.maxRecvWr)
    this.send = new QueueLedger(sendCq)
    this.recv = new QueueLedger(recvCq)
    this.promised = new PromiseOps<Atomic>(this, atomicSlots, caps.maxSendWr)
    this.#sends = new GatheredSends(handle, sendCq, this)
  }

  /** FlushHost: whether the QP is open, and its failure (requests after a refusal that failed it cannot be posted). */
  get open(): boolean { return this.#open }
  get failure(): RdmaError | undefined { return this.#failure }

  /** Requests in flight. */
  get outstanding(): number { return this.pendings.size + this.promised.inFlight + (this.tagged?.inFlight ?? 0) }

  /** The QP's state and failure, as it changes them. */
  setState(state: QpStateName, failure: RdmaError | undefined, open: boolean): void {
    this.#state = state
    this.#failure = failure
    this.#open = open
    this.sendable = open && failure === undefined && state === 'RTS'
  }

  // --- the tagged path ------------------------------------------------------

  setHandler(handler: CompletionHandler | undefined): void {
    const tagged = this.tagged
    if (handler === undefined) {
      if (tagged !== undefined && tagged.inFlight > 0) throw handlerBusy(tagged.inFlight)
      this.tagged = undefined
    } else if (tagged !== undefined) {
      tagged.handler = handler
    } else {
      this.tagged = new TaggedOps(this, handler, this.sendSlots.capacity, this.#sendDispatch)
    }
  }

  /** Posts a tagged request whose arguments were checked: a send slot and CQ credit now, or it throws (it never waits). */
  postTagged(tagged: TaggedOps, verbIndex: number, local: LocalBytes & { region: HeldRegion }, remote: RemoteBytes, tag: number,
    compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): void {
    if (!this.takeSendSlotNow()) throw this.#cannotPostNow(TAGGED_VERBS[verbIndex]!)
    if (this.#sends.count !== 0) this.#sends.flush() // the send queue keeps call order
    const wrId = tagged.add(local.region, tag, verbIndex)
    const refused = this.#postOne(wrId, verbIndex, local, remote, compareAdd, compareAddSmall, swap, swapSmall)
    if (refused !== undefined) {
      tagged.remove(wrId)
      throw refused
    }
  }

  /**
   * The promises' fast path: the first send of a turn, recorded in the
   * promised ring, is posted at once (sends gathered earlier go first), and
   * the turn opens: the sends that follow in it are gathered and posted
   * together. (Leaving the turn closed when the device completed the request
   * inside its post saved the microtask, ~0.2k instructions, but posted 16
   * fetch-and-adds in flight one by one: 14-33% fewer per second on rxe.)
   */
  postNow(wrId: number, verbIndex: number, local: LocalBytes, remote: RemoteBytes,
    compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): void {
    if (this.#sends.count !== 0) this.#sends.flush() // the send queue keeps call order
    this.turnOpen = true
    void RESOLVED.then(this.#closeTurn)
    const refused = this.#postOne(wrId, verbIndex, local, remote, compareAdd, compareAddSmall, swap, swapSmall)
    if (refused !== undefined) this.promised.refuse(wrId, refused)
  }

  /**
   * Posts one signaled WRITE, READ or atomic recorded in a ring (its send slot
   * and CQ credit taken), from the single-request buffer bound once to the
   * native post function; polls in the same native call when it may, since
   * the device often completes the request inside the post. Returns the
   * error the provider refused it with (the caller then takes the request out
   * of its ring), else undefined.
   */
  #postOne(wrId: number, verbIndex: number, local: LocalBytes, remote: RemoteBytes,
    compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): RdmaError | undefined {
    this.send.addPending(this)
    const encoder = this.#single
    if (local.length !== 0) {
      encoder.setOnly(wrId, TAGGED_OPCODES[verbIndex]!, local, remote)
      if (verbIndex >= TAGGED_FETCH_ADD) encoder.setAtomicOperands(0, compareAdd, compareAddSmall, swap, swapSmall)
    } else { // a zero-length WRITE or READ: no SGE
      encoder.reset()
      encoder.addOne(wrId, TAGGED_OPCODES[verbIndex]!, SendFlags.Signaled, 0, 0, 0, remote.addrLo, remote.addrHi, remote.rkey, 0)
    }
    const cq = this.#sendCq
    const poll = cq.mayPollInline()
    const words = encoder.buffer
    if (this.#singleBound !== words) { // first use: bind the buffer once
      this.#singlePostPoll = this.#handle.sendPoster(words, cq.handle, SEND_POSTER_ONE_POLL)
      this.#singlePost = this.#handle.sendPoster(words, cq.handle, SEND_POSTER_ONE)
      this.#singleBound = words
    }
    let polled = 0
    try {
      if (poll) {
        const count = this.#sendDispatch.countWord
        count[0] = 0 // no poll happens if the CQ was closed meanwhile: never a stale count
        this.#singlePostPoll!()
        polled = count[0]!
      } else {
        this.#singlePost!()
      }
    } catch (cause) {
      return fromNative(cause) as RdmaError
    }
    if (poll) cq.polledAfterPost(polled)
    else cq.pollAfterDispatch() // posted from a handler: polled for when that dispatch ends
    return undefined
  }

  /**
   * For the hot paths: takes one send slot and one CQ credit if the QP can
   * post now and both are free without waiting (else takes nothing: the
   * general path then waits for them, or says why it cannot post).
   */
  takeSendSlotNow(): boolean {
    if (!this.sendable) return false
    const slots = this.sendSlots
    if (!slots.tryTake(1)) return false
    if (!this.#sendCq.credits.tryTake(1)) {
      slots.release(1)
      return false
    }
    this.send.credits++
    return true
  }

  /** RingOwner: a request of a ring (tagged or the promises' fast path) finished: completed, refused or abandoned. */
  ringRequestFinished(): void {
    this.sendSlots.release(1)
    this.send.give(1)
    this.send.removePending()
  }

  /** Why takeSendSlotNow() refused, as the error a tagged post throws. */
  #cannotPostNow(verb: string): RdmaError {
    return cannotPostNow(verb, this.qpn, { open: this.#open, failure: this.#failure, state: this.#state, slots: this.sendSlots, credits: this.#sendCq.credits })
  }

  wrongState(verb: string, queue: 'send' | 'recv'): RdmaError { return wrongState(verb, this.qpn, this.#state, queue) }

  stateError(verb: string): RdmaError { return stateError(verb, this.qpn, this.#failure!) }

  // --- the general path -----------------------------------------------------

  /** Where a send gathered in this turn is encoded (its Pending's wordStart is where it starts): then gather() it. */
  get batchEncoder(): WorkRequestEncoder { return this.#sends.encoder }

  /**
   * A Pending send of one work request (its slot and credit taken with
   * takeSendSlotNow(), encoded into batchEncoder), posted now if it is the
   * first of its turn, else with the turn's other sends.
   */
  gather(pending: Pending): void {
    this.#queueSend(pending, 1, NO_OPTIONS)
  }

  /** The next wr_id of a Pending request (one work request). */
  takeWrId(): number { return this.#wrIds.take(1) }

  /** The receives of one recvMany(): wr_ids and the encoder. */
  get wrIds(): WrIdAllocator { return this.#wrIds }
  get encoder(): WorkRequestEncoder { return this.#encoder }

  /**
   * Posts the pieces of a split write or read. Pieces that fit the send queue
   * and the CQ go out together; more are posted in rounds of half of that
   * (each round's last piece signaled), so a 10 GB write works on a queue of
   * 128. Rounds queue for slots in order; the promise settles once: when the
   * last round completes, or with the first failure.
   */
  split(kind: string, pieces: SendWr[], regions: HeldRegion | readonly HeldRegion[], wait: WaitOptions,
    resolve: () => void, reject: (error: Error) => void): void {
    const fits = Math.min(this.sendSlots.capacity, this.#sendCq.credits.capacity)
    const round = pieces.length <= fits ? pieces.length : Math.max(1, fits >> 1)
    let rounds = Math.ceil(pieces.length / round)
    const roundDone = (): void => { if (--rounds === 0) resolve() }
    for (let at = 0; at < pieces.length; at += round) {
      const part = pieces.slice(at, at + round)
      part[part.length - 1]!.flags |= SendFlags.Signaled
      this.submit('send', kind, part.length, regions, wait, roundDone, reject, noResult, (first, enc) => {
        part.forEach((piece, i) => { piece.wrId = first + i; enc.addSend(piece) })
      })
    }
  }

  /**
   * Common path of every operation: checks the QP, waits for queue slots,
   * tracks the request, encodes it and posts it with one native call.
   * `encode` is either a prepared send WR (its wrId is filled in) or a
   * function that encodes the requests from the first wr_id. `custom`: the
   * encode function posts the request itself (memory-window binds).
   */
  submit<T>(queue: 'send' | 'recv', verb: string, count: number, regions: HeldRegion | readonly HeldRegion[], wait: WaitOptions,
    resolve: (value: T) => void, reject: (error: Error) => void, transform: ((entry: CompletionEntry) => T) | undefined,
    encode: Encode, custom = false): void {
    this.reserve(queue, verb, count, wait, reject,
      (left) => this.#post(queue, verb, count, regions, left, resolve, reject, transform, encode, custom))
  }

  /**
   * Checks that `count` work requests can go to `queue` (throws why not), then
   * takes their queue slots and CQ credits and calls `post` with what is left
   * of the wait: now, or once they are free (`reject` when the wait ends
   * first, or the QP closed or failed meanwhile).
   */
  reserve(queue: 'send' | 'recv', verb: string, count: number, wait: WaitOptions, reject: (error: Error) => void,
    post: (wait: WaitOptions) => void, countName = 'operations.length'): void {
    if (!this.#open) throw closedError('QueuePair')
    if (this.#failure) throw this.stateError(verb)
    if (queue === 'send' ? this.#state !== 'RTS' : this.#state === 'RESET') throw this.wrongState(verb, queue)
    const slots = queue === 'send' ? this.sendSlots : this.recvSlots
    const credits = (queue === 'send' ? this.#sendCq : this.#recvCq).credits
    if (count > slots.capacity) throw rangeError(`at most ${slots.capacity} work requests (the queue depth)`, countName, count)
    if (count > credits.capacity) {
      throw new RdmaError(`Cannot ${verb}: ${count} work requests can never fit the ${credits.capacity} entries of the completion queue`, { code: 'ERR_CQ_TOO_SMALL', verb, qpn: this.qpn })
    }
    if (wait.signal?.aborted) throw abortError(verb, this.qpn, wait.signal)
    // Take the queue's slots, then the CQ's credits; wait (bounded by the
    // request's timeout and signal) for what is not free now.
    const reserved = (left: WaitOptions): void => {
      // The slots and credits are taken: #unreserve or Pending.finish gives them back.
      (queue === 'send' ? this.send : this.recv).credits += count
      if (!this.#open || this.#failure) { // closed or failed while it waited
        this.#unreserve(queue, count)
        return reject(this.#open ? this.stateError(verb) : closedError('QueuePair'))
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
      this.sendSlots.release(count)
      this.send.give(count)
    } else {
      this.recvSlots.release(count)
      this.recv.give(count)
    }
  }

  #post<T>(queue: 'send' | 'recv', verb: string, count: number, regions: HeldRegion | readonly HeldRegion[], wait: WaitOptions,
    resolve: (value: T) => void, reject: (error: Error) => void, transform: ((entry: CompletionEntry) => T) | undefined,
    encode: Encode, custom: boolean): void {
    const ledger = queue === 'send' ? this.send : this.recv
    const first = this.#wrIds.take(count)
    const pending = new Pending(this, ledger, queue, verb, first, first + count - 1, regions, resolve, reject, transform)
    if (queue === 'send' && !custom) {
      // Sends made in the same turn of the event loop are posted together, with
      // one native call (one doorbell).
      const sends = this.#sends
      const encoder = sends.encoder
      const wordStart = encoder.used
      try {
        if (typeof encode === 'function') {
          encode(first, encoder)
        } else {
          encode.wrId = first
          encoder.addSend(encode)
        }
      } catch (error) {
        sends.truncate(wordStart)
        this.#unreserve(queue, count)
        return reject(error as Error)
      }
      pending.wordStart = wordStart
      return this.#queueSend(pending, count, wait)
    }
    // Receives, and sends that post themselves (memory-window binds).
    const slots = queue === 'send' ? this.sendSlots : this.recvSlots
    let encoded = false
    try {
      if (custom) this.#sends.flush() // keep the send queue's order
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
      if (!custom) this.#handle.postRecv(encoder.buffer, encoder.count)
    } catch (cause) {
      const error = encoded || custom ? fromNative(cause) : (cause as Error)
      this.refused(pending, count, error, slots)
      return
    }
    // Posted: settle it now if the device already completed it.
    if (queue === 'send') this.#sendCq.pollAfterPost()
  }

  /** Tracks an encoded send and posts it now (the first of a turn, or inline data) or with the rest of the turn. */
  #queueSend(pending: Pending, count: number, wait: WaitOptions): void {
    pending.track(wait)
    const sends = this.#sends
    sends.add(pending, count)
    // The first send of a turn is posted at once, so a caller sees it on the
    // wire when the call returns (and may spin on memory for the answer);
    // so is inline data (the caller may reuse its buffer). Sends that follow
    // in the same turn are gathered and posted together after it.
    if (!this.turnOpen) {
      this.turnOpen = true
      void RESOLVED.then(this.#closeTurn)
      return sends.flush()
    }
    if (sends.encoder.hasInline) return sends.flush()
    sends.flushLater()
  }

  /** FlushHost: a request the provider refused: `posted` of its work requests reached the queue. */
  refused(pending: Pending, count: number, error: Error, slots: WorkQueueSlots, posted = (error as RdmaError).posted ?? 0): void {
    if (posted === 0) {
      pending.untrack()
    } else {
      // Part of a batch reached the queue; its final, signaled request did
      // not. Flush the posted ones through the error state so they complete.
      slots.release(count - posted)
      ;(slots === this.sendSlots ? this.send : this.recv).give(count - posted)
      pending.truncate(posted)
      this.#owner.moveToError()
    }
    pending.reject(error)
  }

  // --- completions and the end ----------------------------------------------

  /** CompletionOwner: the request of a completion on this QP (an SRQ receive, or a failed unsignaled member of a batch). */
  pendingFor(wrId: number): Pending | TaggedOps | PromiseOps<Atomic> | undefined {
    if (wrId >= PROMISE_WR_ID_BASE) return wrId >= TAGGED_WR_ID_BASE ? this.tagged : this.promised
    const pending = this.pendings.get(wrId) ?? this.#srqPendings?.get(wrId)
    if (pending !== undefined) return pending
    return this.pendings.containing(wrId)
  }

  /** PendingOwner: the device is done with a request: its slots and credits are free. */
  released(pending: Pending): void {
    if (pending.queue === 'send') {
      this.sendSlots.release(pending.slots)
      this.send.give(pending.slots)
    } else {
      this.recvSlots.release(pending.slots)
      this.recv.give(pending.slots)
    }
  }

  /** PendingOwner, RingOwner: an error completion moved the QP to the error state. */
  failed(error: RdmaError): void { this.#owner.failed(error) }

  /** PendingOwner */
  orphaned(entry: CompletionEntry): void { this.#owner.orphaned(entry) }

  /** Rejects this QP's requests that wait for a queue slot or CQ credit. */
  failWaiting(error: Error): void {
    this.sendSlots.fail(error)
    this.recvSlots.fail(error)
    this.#sendCq.credits.fail(error, this)
    this.#recvCq.credits.fail(error, this)
  }

  /**
   * CompletionOwner: a CQ of this QP failed, so no completion will come: the
   * QP fails and every request in flight is rejected with `error` (the
   * memory stays in use until the QP is closed).
   */
  failAll(error: RdmaError): void {
    this.#owner.failed(error)
    for (const pending of this.pendings.values()) pending.reject(error)
    this.promised.reportAll(error)
    this.tagged?.reportAll(error)
  }

  /** The QP was destroyed: the device is done with every buffer; every request is rejected with ERR_CLOSED. */
  abandonAll(): void {
    const error = closedError('QueuePair')
    this.failWaiting(error) // first: the slots abandonAll frees must not let them post
    abandonAll(this.pendings.values(), error)
    this.promised.abandonAll(error)
    this.tagged?.abandonAll(error)
  }
}

const noResult = (): undefined => undefined
