// A completion queue whose completions are delivered on the event loop: the
// addon watches the completion channel and hands over batches of completions;
// this class settles the matching requests. A busy-poll mode trades CPU for
// latency.
import { performance } from 'node:perf_hooks'
import { COMPLETION_WORDS, native, type NativeCompletionQueue } from '../native/addon.js'
import { call, closedError, errnoName, fromNative, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import type { CompletionEntry, Pending } from '../ops/pending.js'
import { WorkQueueSlots } from '../ops/slots.js'
import { afterPost, deliverHeld, reportsHeld } from '../ops/tagged-ops.js'
import { PROMISE_WR_ID_BASE } from '../ops/promise-ops.js'
import { integer, oneOf, optionalObject } from '../core/validate.js'
import type { Device } from './device.js'

const WORDS = COMPLETION_WORDS
const TWO_32 = 4294967296
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
  /** Completion vector (default 0). */
  compVector?: number
  /** Completions handed over per native call (default 64). */
  pollBatch?: number
}

/** A queue pair (or SRQ) whose queues complete here, as the CQ sees it. */
export interface CompletionOwner {
  /** The request (or the tagged requests' ring) a completion belongs to (by wr_id). */
  pendingFor(wrId: number): { complete(entry: CompletionEntry): void } | undefined
  /** The CQ failed: no completion will arrive; reject every request waiting for one. */
  failAll(error: RdmaError): void
}

export class CompletionQueue extends Resource {
  protected readonly kind = 'CompletionQueue'
  /** @internal */ readonly handle: NativeCompletionQueue
  readonly device: Device
  readonly pollMode: 'event' | 'busy'
  readonly #words: Uint32Array
  /**
   * @internal The count of the last poll, written by the addon (the output's
   * last word): the hot-path functions return nothing, since making a number
   * costs ~50 instructions per call.
   */
  readonly polledCount: Uint32Array
  /** The native poll, bound to this CQ (no unwrap per call); its count is in polledCount[0]. */
  readonly #pollToWord: () => void
  readonly #spinMs: number
  readonly #owners = new Map<number, WeakRef<CompletionOwner>>() // weak: a QP can still be collected
  /**
   * The owner of the last completion, held until the queue is idle again:
   * each WeakRef.deref() adds its target to the set kept alive until the
   * microtask checkpoint ends (~0.25k instructions per completion in the
   * profile), and completions come from the same few QPs.
   */
  #lastQpn = -1
  #lastOwner: CompletionOwner | undefined
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
    else this.#dispatch(n)
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
  #drainScheduled = false
  #dispatching = false
  /** A tagged post made during a dispatch could not poll (polls do not nest): poll once the dispatch is over. */
  #repoll = false
  #inlineBudget = INLINE_BUDGET
  #inlineResetScheduled = false
  // Reused for every completion: a Pending reads what it needs and keeps nothing.
  readonly #entry: CompletionEntry = {
    wrId: 0, status: 0, opcode: 0, byteLength: 0, immOrRkey: 0, qpn: 0, srcQp: 0,
    wcFlags: 0, pkeyIndex: 0, slid: 0, sl: 0, dlidPathBits: 0, vendorError: 0,
  }

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
    const compVector = integer(o.compVector ?? 0, 'options.compVector', 0, 1024)
    const batch = integer(o.pollBatch ?? 64, 'options.pollBatch', 1, 4096)
    this.device = device
    this.#words = new Uint32Array(batch * WORDS + 1) // the completions, then the count word
    this.polledCount = this.#words.subarray(batch * WORDS)
    this.#capacity = batch
    this.handle = call(() => new native.CompletionQueue(device.handle, entries, this.#words, this.#onCompletions, compVector))
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
    for (const ref of [...this.#owners.values()]) ref.deref()?.failAll(error)
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

  /** @internal */
  addOwner(qpn: number, owner: CompletionOwner): void {
    this.#owners.set(qpn, new WeakRef(owner))
    if (qpn === this.#lastQpn) this.#forgetOwner() // a reused QP number
  }
  /** @internal */
  removeOwner(qpn: number): void {
    this.#owners.delete(qpn)
    if (qpn === this.#lastQpn) this.#forgetOwner()
  }

  /** The native poll: the number of completions now in the output (throws what ibv_poll_cq failed with). */
  #poll(): number {
    this.#pollToWord()
    return this.polledCount[0]!
  }

  #forgetOwner(): void {
    this.#lastQpn = -1
    this.#lastOwner = undefined
  }

  /** @internal */
  addPending(): void {
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
    if (this.#pending === 0) this.#forgetOwner() // idle: a dropped QP can be collected
    if (this.#pending === 0 && this.#referenced && this.#open) {
      this.#referenced = false
      this.handle.setWaiting(false)
    }
  }

  /** Drains the queue now; returns the number of completions handled. */
  poll(): number {
    if (!this.#open) throw closedError(this.kind) // not assertOpen(): Resource's accessor is megamorphic
    // Reports a post found and held for after it: a loop that polls until its request is reported gets them here.
    if (reportsHeld()) deliverHeld()
    let total = 0
    for (;;) {
      let n: number
      try { n = this.#poll() } catch (error) { throw fromNative(error) }
      if (n > 0) this.#dispatch(n)
      total += n
      if (n < this.#capacity) return total
    }
  }

  /**
   * @internal Before a QP of this queue is destroyed: delivers the
   * completions already in the queue, so that work the device finished is
   * reported as finished rather than abandoned with the QP (a message that
   * arrived just before its connection went down is still received). Not
   * from inside a dispatch: a nested poll would overwrite the output words
   * the outer one is still reading.
   */
  drainBeforeClose(): void {
    if (this.#dispatching || !this.#open || this.#failure !== undefined) return
    try {
      this.poll()
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
    return !this.#dispatching && this.#inlineBudget > 0 && this.#pending !== 0 && this.#open
  }

  /** @internal A post polled `n` completions into the output right after posting (mayPollInline() said it could). */
  polledAfterPost(n: number): void {
    if (n === 0 && this.pollMode === 'busy' && this.#pending === 1 && this.#spinMs > 0) {
      try { n = this.#spinOnce() } catch { return }
    }
    if (n === 0) return
    this.#spendInlineBudget(n)
    // Inside a post: tagged requests' handlers wait for the end of the microtask checkpoint.
    const outer = afterPost.dispatching
    afterPost.dispatching = true
    try {
      this.#dispatch(n)
    } finally {
      afterPost.dispatching = outer
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
    if (this.#dispatching) this.#repoll = true
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

  readonly #spin = (): void => {
    this.#spinScheduled = false
    if (!this.#open || this.#pending === 0) return
    const n = this.#spinOnce()
    if (n > 0) this.#dispatch(n)
    if (this.#pending > 0) this.#scheduleSpin()
  }

  // A full batch means more may be waiting: drain them on a later turn of the
  // loop (the channel only fires for completions that arrive after re-arming).
  readonly #drain = (): void => {
    this.#drainScheduled = false
    if (this.closed) return
    const n = this.#poll()
    if (n !== 0) this.#dispatch(n)
  }

  #dispatch(count: number): void {
    this.#dispatchOnce(count)
    if (this.#dispatching) return // nested: the outer dispatch goes on
    // A handler that posted during the dispatch (a chain of tagged requests)
    // gets its completion polled for here, as the post itself would have, in
    // a loop: no turn of the event loop per request, and no recursion.
    while (this.#repoll) {
      this.#repoll = false
      if (!this.mayPollInline()) return
      let n: number
      try {
        n = this.#poll()
        if (n === 0 && this.pollMode === 'busy' && this.#pending === 1 && this.#spinMs > 0) n = this.#spinOnce()
      } catch {
        return // reported by the regular (channel or busy) path
      }
      if (n === 0) return
      if (n > 0) this.#spendInlineBudget(n)
      this.#dispatchOnce(n)
    }
  }

  #dispatchOnce(count: number): void {
    if (count < 0) return this.#failed(-count, 'ibv_poll_cq')
    const w = this.#words
    const entry = this.#entry
    const nested = this.#dispatching
    this.#dispatching = true
    // Completions come in runs from one QP: look its owner up once per run.
    let qpn = this.#lastQpn
    let owner = this.#lastOwner
    try {
      for (let i = 0, o = 0; i < count; i++, o += WORDS) {
        const wrId = w[o]! + w[o + 1]! * TWO_32
        const status = w[o + 2]!
        entry.wrId = wrId
        entry.status = status
        entry.qpn = w[o + 6]!
        entry.vendorError = w[o + 13]!
        // A ring's request (the promises' fast path, tagged) that succeeded
        // needs no more of the entry; the rest is read for the others.
        if (wrId < PROMISE_WR_ID_BASE || status !== 0) {
          entry.opcode = w[o + 3]!
          entry.byteLength = w[o + 4]!
          entry.immOrRkey = w[o + 5]!
          entry.srcQp = w[o + 7]!
          entry.wcFlags = w[o + 8]!
          entry.pkeyIndex = w[o + 9]!
          entry.slid = w[o + 10]!
          entry.sl = w[o + 11]!
          entry.dlidPathBits = w[o + 12]!
        }
        if (entry.qpn !== qpn) owner = this.#owners.get(qpn = entry.qpn)?.deref()
        owner?.pendingFor(wrId)?.complete(entry)
      }
    } finally {
      this.#dispatching = nested
    }
    if (owner !== undefined) {
      this.#lastQpn = qpn
      this.#lastOwner = owner
      if (this.#pending === 0 && !this.#unrefScheduled) { // forgotten on a later turn, when idle
        this.#unrefScheduled = true
        setImmediate(this.#unrefIfIdle)
      }
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
