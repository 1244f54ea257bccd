// A completion queue whose completions are delivered on the event loop: the
// addon watches the completion channel and hands over batches of completions;
// this class settles the matching requests. A busy-poll mode trades CPU for
// latency.
import { performance } from 'node:perf_hooks'
import { native, type NativeCompletionQueue } from '../native/addon.js'
import { call, closedError, errnoName, fromNative, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { integer, oneOf, optionalObject } from '../core/validate.js'
import { WorkQueueSlots } from '../ops/slots.js'
import { CompletionDispatch, type CompletionOwner } from '../ops/dispatch.js'
import type { Device } from './device.js'

/** The CQ's dispatch, for the QPs and rings of this package (a module-private key: not reachable from the package entry). */
export const CQ_DISPATCH: unique symbol = Symbol('dispatch')
/**
 * Completions harvested right after a post (without a turn of the event loop)
 * before the queue lets the loop run again: keeps timers and I/O firing when
 * every request completes at once (Soft-RoCE completes inside the post).
 */
const INLINE_BUDGET = 64

export interface CompletionQueueOptions {
  /** Minimum number of entries (default 1024). */
  entries?: number
  /** 'event' (default): woken by the completion channel. 'busy': poll from the loop while requests wait. */
  pollMode?: 'event' | 'busy'
  /** How long one busy-poll turn may spin before yielding to the loop, in µs (default 50). */
  spinMicros?: number
  /**
   * Busy mode: after this long with requests waiting but no completion, in
   * µs, the queue stops polling from the loop and waits for the completion
   * channel, as an event queue does, until a completion or a new request
   * (default 10000; 0: poll as long as requests wait). Receives posted ahead
   * (a server's) otherwise keep a core spinning while nothing arrives.
   */
  idleMicros?: number
  /** Completion vector (default 0). */
  compVector?: number
  /** Completions handed over per native call (default 64). */
  pollBatch?: number
}

export class CompletionQueue extends Resource {
  protected readonly kind = 'CompletionQueue'
  /** @internal */ readonly handle: NativeCompletionQueue
  readonly device: Device
  readonly pollMode: 'event' | 'busy'
  /**
   * The only reader of the output words the addon polls into (ops/dispatch.ts).
   * The count of a poll is in its count word: the hot-path functions return
   * nothing, since making a number costs ~50 instructions per call.
   */
  readonly #dispatch: CompletionDispatch
  /** The native poll, bound to this CQ (no unwrap per call); its count is in the dispatch's count word. */
  readonly #pollToWord: () => void
  readonly #countWord: Uint32Array
  readonly #spinMs: number
  readonly #idleMs: number
  readonly #capacity: number
  /**
   * @internal Entries promised to work requests in flight: each work request
   * posted to a QP of this CQ may produce one completion (a failed or flushed
   * one even when unsignaled), so requests wait for credit rather than
   * overrun the queue.
   */
  readonly credits: WorkQueueSlots
  // Held here: the addon holds it weakly. A negative count: the channel failed (-errno, syscall).
  readonly #onCompletions = (n: number, syscall?: string): void => {
    if (n < 0) this.#failed(-n, syscall ?? 'ibv_poll_cq')
    else this.#dispatchPolled(n)
  }
  /** @internal The kernel handle: CQ_ERR events name the CQ by it. */
  readonly kernelHandle: number
  #failure: RdmaError | undefined
  #pending = 0
  /** Whether close() has not run, for the hot paths (Resource's shared `closed` getter is a megamorphic access). */
  #open = true
  #referenced = false // whether the addon's watcher keeps the loop alive
  #unrefScheduled = false
  #spinScheduled = false
  /** Busy mode: when the loop's polls began to find nothing (-1: they found completions since). */
  #idleSince = -1
  /** Busy mode, idle for idleMicros: the channel is armed and the loop polls nothing. */
  #parked = false
  #drainScheduled = false
  /** Asked to poll while a batch was delivered (a handler's post or cq.poll()): poll once the dispatch is over. */
  #repoll = false
  #inlineBudget = INLINE_BUDGET
  #inlineResetScheduled = false

  /** Not constructible: made by device.createCq(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(device: Device, options?: CompletionQueueOptions)
  constructor(device: Device, options: CompletionQueueOptions = {}) {
    super()
    const o = optionalObject(options, 'options')
    const entries = integer(o.entries ?? 1024, 'options.entries', 1, 4194304)
    this.pollMode = oneOf(o.pollMode, 'options.pollMode', ['event', 'busy'] as const, 'event')
    this.#spinMs = integer(o.spinMicros ?? 50, 'options.spinMicros', 0, 1_000_000) / 1000
    this.#idleMs = integer(o.idleMicros ?? 10_000, 'options.idleMicros', 0, 1_000_000_000) / 1000
    const compVector = integer(o.compVector ?? 0, 'options.compVector', 0, 1024)
    const batch = integer(o.pollBatch ?? 64, 'options.pollBatch', 1, 4096)
    this.device = device
    this.#dispatch = new CompletionDispatch(batch)
    this.#countWord = this.#dispatch.countWord
    this.#capacity = batch
    this.handle = call(() => new native.CompletionQueue(device.handle, entries, this.#dispatch.words, this.#onCompletions, compVector))
    // Busy polling finds completions from the loop while requests wait: the
    // channel need not wake it (each wakeup costs syscalls).
    if (this.pollMode === 'busy') this.handle.setRearm(false)
    this.#pollToWord = this.handle.poller(true)
    this.credits = new WorkQueueSlots(this.handle.entries)
    this.adoptedBy(device)
    this.kernelHandle = this.handle.handle
    device.trackCq(this)
  }

  /** Set once the queue failed (CQ_ERR, the device failed, or its channel or a poll failed): it delivers nothing more. */
  get error(): RdmaError | undefined { return this.#failure }

  #failed(errno: number, syscall: string): void {
    const code = errnoName(errno)
    this.failAll(new RdmaError(`CompletionQueue failed: ${syscall}: ${code}`, { code, errno, syscall }))
  }

  /**
   * @internal No completion will be delivered any more: every request waiting
   * on this queue is rejected with `error` (its memory stays in use until its
   * QP is closed), the loop is no longer kept alive for it, and the device
   * emits 'error' (unless the device itself failed and emits once).
   */
  failAll(error: RdmaError, emit = true): void {
    if (this.#failure || this.closed) return
    this.#failure = error
    for (const owner of this.#dispatch.owners()) owner.failAll(error)
    if (this.#referenced) {
      this.#referenced = false
      this.handle.setWaiting(false)
    }
    if (emit) this.device.emit('error', error)
  }

  /** Actual number of entries. */
  get entries(): number { return this.handle.entries }

  /** Requests waiting for a completion on this queue. */
  get pending(): number { return this.#pending }

  /**
   * Busy mode: whether the loop is polling the queue now (requests wait and
   * a completion came within idleMicros). False in event mode, and while an
   * idle busy queue waits for its channel.
   */
  get spinning(): boolean { return this.pollMode === 'busy' && this.#pending > 0 && !this.#parked && this.#open && this.#failure === undefined }

  /** @internal The dispatch of this CQ's completions (ops/dispatch.ts), for its QPs. */
  get [CQ_DISPATCH](): CompletionDispatch { return this.#dispatch }

  /** @internal */
  addOwner(qpn: number, owner: CompletionOwner): void { this.#dispatch.addOwner(qpn, owner) }
  /** @internal */
  removeOwner(qpn: number): void { this.#dispatch.removeOwner(qpn) }

  /** The native poll: the number of completions now in the output (throws what ibv_poll_cq failed with). */
  #poll(): number {
    this.#pollToWord()
    return this.#countWord[0]!
  }

  /** @internal */
  addPending(): void {
    if (this.#parked) this.#unpark() // a new request: poll for it from the loop again
    if (this.#pending++ === 0) {
      if (!this.#referenced) {
        this.#referenced = true
        this.handle.setWaiting(true)
      }
      if (this.pollMode === 'busy') this.#scheduleSpin()
    }
  }

  /** @internal */
  removePending(): void {
    // Unreference on a later turn: back-to-back requests (ping-pong) then
    // cost no native call at all.
    if (--this.#pending === 0 && !this.#unrefScheduled) {
      this.#unrefScheduled = true
      setImmediate(this.#unrefIfIdle)
    }
  }

  readonly #unrefIfIdle = (): void => {
    this.#unrefScheduled = false
    if (this.#pending === 0) this.#dispatch.forgetOwner() // idle: a dropped QP can be collected
    if (this.#pending === 0 && this.#referenced && this.#open) {
      this.#referenced = false
      this.handle.setWaiting(false)
    }
  }

  /**
   * Drains the queue now; returns the number of completions handled. Called
   * from a completion handler of this queue (during its dispatch), it
   * delivers the rest of the batch being dispatched and has the queue polled
   * again as soon as that dispatch ends (polls do not nest).
   */
  poll(): number {
    if (!this.#open) throw closedError(this.kind) // not assertOpen(): Resource's accessor is megamorphic
    const dispatch = this.#dispatch
    // Reports a post found and held for after it: a loop that polls until its request is reported gets them here.
    if (dispatch.reportsHeld) dispatch.deliverHeld()
    if (dispatch.dispatching) {
      this.#repoll = true
      return dispatch.finishBatch()
    }
    return this.#pollAll()
  }

  /** Polls and delivers until the queue is empty (not from inside a dispatch). */
  #pollAll(): number {
    let total = 0
    for (;;) {
      let n: number
      try { n = this.#poll() } catch (error) { throw fromNative(error) }
      if (n > 0) this.#dispatchPolled(n)
      total += n
      if (n < this.#capacity) return total
    }
  }

  /**
   * @internal Before a QP of this queue is destroyed: delivers the
   * completions already in the queue, so that work the device finished is
   * reported as finished rather than abandoned with the QP (a message that
   * arrived just before its connection went down is still received). From
   * inside a dispatch (a handler closed the QP), the rest of the batch being
   * delivered goes first, then the queue is polled.
   */
  drainBeforeClose(): void {
    if (!this.#open || this.#failure !== undefined) return
    const dispatch = this.#dispatch
    if (dispatch.dispatching) dispatch.finishBatch() // the words are free again: a nested poll reads only new entries
    try {
      this.#pollAll()
    } catch {
      // a queue that cannot be polled delivers nothing more; its requests are abandoned with the QP
    }
  }

  /**
   * @internal Called right after a work request was posted to a queue that
   * completes here: harvests completions that are already there (one
   * non-blocking poll; in busy mode, a spin of up to spinMicros while this is
   * the only request waiting), so that a fast request settles without waiting
   * for a turn of the event loop. Bounded by INLINE_BUDGET per loop turn.
   */
  pollAfterPost(): void {
    if (!this.mayPollInline()) return
    let n: number
    try {
      n = this.#poll()
    } catch {
      return // reported by the regular (channel or busy) path
    }
    this.polledAfterPost(n)
  }

  /** @internal Whether a post may poll this queue right after (the post function then polls in the same native call). */
  mayPollInline(): boolean {
    return !this.#dispatch.dispatching && this.#inlineBudget > 0 && this.#pending !== 0 && this.#open
  }

  /** @internal A post polled `n` completions into the output right after posting (mayPollInline() said it could). */
  polledAfterPost(n: number): void {
    if (n === 0 && this.pollMode === 'busy' && this.#pending === 1 && this.#spinMs > 0) {
      try { n = this.#spinOnce() } catch { return }
    }
    if (n === 0) return
    this.#spendInlineBudget(n)
    // Inside a post: tagged requests' handlers wait for the end of the microtask checkpoint.
    const dispatch = this.#dispatch
    const outer = dispatch.holding
    dispatch.holding = true
    try {
      this.#dispatchPolled(n)
    } finally {
      dispatch.holding = outer
    }
  }

  // The budget counts completions, not polls: one poll can harvest a whole
  // batch per QP, and each settled batch posts the next from a microtask,
  // so counting polls let a transfer of thousands of work requests run in
  // one macrotask, with no timer or I/O (another connection's handshake)
  // handled until it ended.
  #spendInlineBudget(n: number): void {
    this.#inlineBudget -= n
    if (!this.#inlineResetScheduled) {
      this.#inlineResetScheduled = true
      setImmediate(this.#resetInlineBudget)
    }
  }

  /** @internal A tagged request was posted during this queue's dispatch: it is polled for when the dispatch ends. */
  pollAfterDispatch(): void {
    if (this.#dispatch.dispatching) this.#repoll = true
  }

  readonly #resetInlineBudget = (): void => {
    this.#inlineResetScheduled = false
    this.#inlineBudget = INLINE_BUDGET
  }

  /**
   * Polls until a completion arrives or about spinMicros pass. The clock is
   * read every 16 polls, the first time after 16: a completion that arrives
   * within them costs no clock read (where the clock is slow, as the
   * emulated guest's HPET at 1.9 µs a read, that read cost more than the wait).
   */
  #spinOnce(): number {
    let deadline = -1
    for (let i = 1; ; i++) {
      const n = this.#poll()
      if (n !== 0) return n
      if ((i & 15) === 0) {
        const now = performance.now()
        if (deadline < 0) deadline = now + this.#spinMs
        else if (now >= deadline) return 0
      }
    }
  }

  #scheduleSpin(): void {
    if (this.#spinScheduled) return
    this.#spinScheduled = true
    setImmediate(this.#spin)
  }

  // Busy polling and the drain run from the loop: a failed ibv_poll_cq there
  // fails the queue (and the device emits 'error'), as the channel's does.
  readonly #spin = (): void => {
    this.#spinScheduled = false
    if (!this.#open || this.#pending === 0 || this.#failure !== undefined) return
    let n: number
    try { n = this.#spinOnce() } catch (error) { return this.#pollFailed(error) }
    if (n > 0) this.#dispatchPolled(n)
    else if (this.#idleMs > 0) {
      const now = performance.now()
      if (this.#idleSince < 0) this.#idleSince = now
      else if (now - this.#idleSince >= this.#idleMs) return this.#park()
    }
    if (this.#pending > 0) this.#scheduleSpin()
  }

  /**
   * Idle for idleMicros: arms the channel and stops polling from the loop.
   * A completion that came after the last poll and before the arming raises
   * no event: one poll after arming finds it.
   */
  #park(): void {
    this.#parked = true
    let n: number
    try {
      this.handle.setRearm(true)
      n = this.#poll()
    } catch (error) {
      return this.#pollFailed(error)
    }
    if (n > 0) this.#dispatchPolled(n)
  }

  /** A completion or a request while parked: back to polling from the loop (the armed channel fires once more at most). */
  #unpark(): void {
    this.#parked = false
    this.#idleSince = -1
    if (!this.#open || this.#failure !== undefined) return
    try { this.handle.setRearm(false) } catch (error) { return this.#pollFailed(error) }
    this.#scheduleSpin()
  }

  // A full batch means more may be waiting: drain them on a later turn of the
  // loop (the channel only fires for completions that arrive after re-arming).
  readonly #drain = (): void => {
    this.#drainScheduled = false
    if (this.closed || this.#failure !== undefined) return
    let n: number
    try { n = this.#poll() } catch (error) { return this.#pollFailed(error) }
    if (n !== 0) this.#dispatchPolled(n)
  }

  #pollFailed(error: unknown): void {
    const e = fromNative(error) as RdmaError
    this.#failed(e.errno ?? 5 /* EIO */, e.syscall ?? 'ibv_poll_cq')
  }

  /** `count` completions were polled into the output: delivered, then what handlers posted meanwhile is polled for. */
  #dispatchPolled(count: number): void {
    const dispatch = this.#dispatch
    if (count < 0) return this.#failed(-count, 'ibv_poll_cq')
    this.#idleSince = -1
    if (this.#parked) this.#unpark()
    dispatch.deliver(count)
    if (dispatch.dispatching) return // nested (a post inside a handler): the outer dispatch goes on
    // A handler that posted during the dispatch (a chain of tagged requests)
    // gets its completion polled for here, as the post itself would have, in
    // a loop: no turn of the event loop per request, and no recursion.
    while (this.#repoll) {
      this.#repoll = false
      if (!this.mayPollInline()) break
      let n: number
      try {
        n = this.#poll()
        if (n === 0 && this.pollMode === 'busy' && this.#pending === 1 && this.#spinMs > 0) n = this.#spinOnce()
      } catch {
        break // reported by the regular (channel or busy) path
      }
      if (n === 0) break
      this.#spendInlineBudget(n)
      count = n
      dispatch.deliver(n)
    }
    if (dispatch.holdsOwner && this.#pending === 0 && !this.#unrefScheduled) { // forgotten on a later turn, when idle
      this.#unrefScheduled = true
      setImmediate(this.#unrefIfIdle)
    }
    if (count === this.#capacity && !this.#drainScheduled && this.#open) {
      this.#drainScheduled = true
      setImmediate(this.#drain)
    }
  }

  protected override afterClose(): void {
    this.#open = false
    this.device.untrackCq(this)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}
