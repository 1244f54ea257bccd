// A client of a remote lock table that lives in another process's registered
// memory, driven only by one-sided atomics (the table's CPU never runs):
// acquire = one CAS (free word -> owner|next sequence; the sequence is the
// fencing token, lock-word.ts) with bounded exponential backoff, release =
// CAS back to the free word of that sequence, and a lease lets a waiter
// steal a lock whose holder went silent (CAS on the exact stale value).
// mode 'fifo' grants in arrival order instead (a ticket lock: ticket.ts).
// See docs/locks.md for the protocol and what one-sided operations cannot enforce.
import { performance } from 'node:perf_hooks'
import { RdmaError } from '../core/errors.js'
import { RemoteSlice } from '../verbs/remote.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import { instance, integer, object, oneOf, optionalInteger, typeError } from '../core/validate.js'
import { Watchdog, type Bound, type BoundErrors } from './bounded.js'
import { backoffMs, decodeWord, FREE, heldWord, isFree, MAX_OWNER, nextSequence, releasedWord, sequenceOf } from './lock-word.js'
import { deadlineBound, forfeit, HoldTime, renewedWord, servingWord, ticketOf, waitForTurn, type TicketTable } from './ticket.js'

/** 'spin': CAS with backoff, fastest uncontended, unfair under contention; 'fifo': tickets, granted in arrival order. */
export type LockMode = 'spin' | 'fifo'
const LOCK_MODES = ['spin', 'fifo'] as const

export interface RemoteLockTableOptions {
  /** The lock words: 8 bytes per lock, 8-byte aligned, registered with remote atomic access. */
  locks: RemoteSlice
  /**
   * FIFO mode: one 8-byte ticket counter per lock (same length as `locks`),
   * starting at 0. Not used in spin mode, whose fencing counter is in the lock word.
   */
  tokens?: RemoteSlice
  /** This client's id, 1..65535, unique among the table's clients. */
  owner: number
  /** How long a grant lasts without renew() (default 2000 ms). */
  leaseMs?: number
  /** What a waiter adds to the lease before it steals: covers clock-rate differences (default leaseMs / 2). */
  graceMs?: number
  /** Cap of the exponential backoff between attempts (default 16 ms); a FIFO waiter sleeps at most 8x this between polls. */
  maxBackoffMs?: number
  /**
   * 'spin' (default): the lock word is owner|sequence (the fencing counter), taken by CAS with backoff.
   * 'fifo': a ticket lock (the counter gives tickets, the lock word says
   * whose turn it is): grants in arrival order, none starved. Every client of
   * a table must use the same mode.
   */
  mode?: LockMode
}

export interface LockWaitOptions {
  /** Give up with ERR_LOCK_TIMEOUT after this long (default 10000 ms). */
  timeoutMs?: number
  signal?: AbortSignal
}

/** A held lock. Valid until `leaseEndsAt` (performance.now() time), unless renewed. */
export interface LockGrant {
  readonly lock: number
  /** The lock word while this grant holds it ('spin': owner | sequence; 'fifo': ticket << 16 | renewals). */
  readonly word: bigint
  /** Fencing token: larger than the token of every earlier holder of this lock that kept its lease. */
  readonly token: bigint
  /** performance.now() after which this holder must no longer write protected data. */
  readonly leaseEndsAt: number
  /** The stale lock word this grant replaced, when the lock was stolen from a holder whose lease ran out. */
  readonly stolenFrom: bigint | undefined
  /** CAS attempts this acquisition took. */
  readonly attempts: number
}

const DEFAULT_TIMEOUT = 10_000

export class RemoteLockTable {
  readonly qp: QueuePair
  readonly owner: number
  readonly size: number
  readonly leaseMs: number
  readonly graceMs: number
  readonly maxBackoffMs: number
  readonly mode: LockMode
  readonly #locks: RemoteSlice
  readonly #tokens: RemoteSlice | undefined
  readonly #lockSlices: RemoteSlice[] = []
  readonly #tokenSlices: RemoteSlice[] = []
  /** Watches the deadlines of every call in flight with one timer. */
  readonly #watchdog = new Watchdog()
  /** FIFO: what the ticket waits need (ticket.ts), with how long this client holds the lock. */
  readonly #tickets: TicketTable
  /** heldWord(owner, 0): a held word is this | its sequence. */
  readonly #ownerBits: bigint
  /** Spin mode: per lock, the free word this client expects (the one its last release left, or the last one it saw). */
  readonly #expectFree: bigint[] = []

  constructor(qp: QueuePair, options: RemoteLockTableOptions) {
    if (typeof (qp as { compareAndSwap?: unknown })?.compareAndSwap !== 'function') throw typeError('a QueuePair', 'qp', qp)
    const o = object(options, 'options')
    const mode = oneOf(o.mode, 'options.mode', LOCK_MODES, 'spin')
    const locks = instance(o.locks, 'options.locks', RemoteSlice)
    const tokens = o.tokens === undefined && mode === 'spin' ? undefined : instance(o.tokens, 'options.tokens', RemoteSlice)
    for (const [name, slice] of [['options.locks', locks], ['options.tokens', tokens]] as const) {
      if (slice === undefined) continue
      if (slice.length === 0 || slice.length % 8 !== 0) throw typeError('a non-empty multiple of 8 bytes', `${name}.length`, slice.length)
      if (slice.addrLo % 8 !== 0) throw typeError('an 8-byte aligned remote address', name, slice.addr)
    }
    if (tokens !== undefined && tokens.length !== locks.length) throw typeError(`${locks.length} bytes (one counter per lock)`, 'options.tokens.length', tokens.length)
    this.qp = qp
    this.owner = integer(o.owner, 'options.owner', 1, MAX_OWNER)
    this.#ownerBits = heldWord(this.owner, 1n) - 1n
    this.size = locks.length / 8
    this.leaseMs = optionalInteger(o.leaseMs, 'options.leaseMs', 1, 2 ** 31 - 1, 2000)
    this.graceMs = optionalInteger(o.graceMs, 'options.graceMs', 0, 2 ** 31 - 1, Math.ceil(this.leaseMs / 2))
    this.maxBackoffMs = optionalInteger(o.maxBackoffMs, 'options.maxBackoffMs', 1, 60_000, 16)
    this.mode = mode
    this.#locks = locks
    this.#tokens = tokens
    this.#tickets = { qp, leaseMs: this.leaseMs, graceMs: this.graceMs, maxBackoffMs: this.maxBackoffMs, hold: new HoldTime() }
  }

  /** The remote lock word of lock `lock`. */
  lockWord(lock: number): RemoteSlice {
    // Made once per lock (a slice is checked and allocated): sparse, so a large table costs only the locks used.
    const cached = typeof lock === 'number' ? this.#lockSlices[lock] : undefined
    if (cached !== undefined) return cached
    integer(lock, 'lock', 0, this.size - 1)
    return (this.#lockSlices[lock] = this.#locks.region.slice(this.#locks.offset + lock * 8, 8))
  }

  /**
   * Takes lock `lock`: CAS(free word -> owner|next sequence) until it
   * succeeds; the sequence it wrote is the grant's fencing token, so an
   * uncontended acquire is one atomic. The free word expected is the one
   * this client's last release of the lock left (or the last it saw); a CAS
   * that finds another free word (someone else used the lock since) is
   * retried at once with that word. A CAS that finds the lock held backs off
   * exponentially (capped at maxBackoffMs) and then expects the word that
   * holder's release will leave. A held word that stays the same for
   * leaseMs + graceMs of this client's clock belongs to a holder whose lease
   * ran out: it is stolen with a CAS on that exact value. Rejects with
   * ERR_LOCK_TIMEOUT after timeoutMs (ABORT_ERR on abort); never waits forever.
   */
  async acquire(lock: number, options: LockWaitOptions = NO_OPTIONS): Promise<LockGrant> {
    const slot = this.lockWord(lock)
    const { signal, timeoutMs } = waitOptions(options)
    if (signal?.aborted) throw aborted(lock, signal)
    const now = performance.now()
    const deadline = now + timeoutMs
    // One deadline for the whole acquire, watched by the table's one timer: its atomics take the QP's fast path.
    // Its timeout error tells bound.attempts and bound.last (what the last CAS found), kept up to date below.
    const bound = this.#watchdog.start(deadline, signal, ACQUIRE_ERRORS, lock, timeoutMs)
    if (this.mode === 'fifo') return this.#acquireTicket(lock, slot, this.#tokenWord(lock), bound, deadline, timeoutMs)
    let expect = this.#expectFree[lock] ?? FREE
    let seen = FREE
    let seenSince = 0
    let leaseStart = now
    let backoffs = 0 // sleeps after finding the lock held: the backoff grows with these, not with retries at once
    let caughtUp = false // the last CAS was the one retry at once after finding the lock held at a newer sequence
    try {
      for (;;) {
        const attempt = ++bound.attempts
        if (attempt > 1) {
          leaseStart = performance.now()
          if (leaseStart >= deadline) throw timedOut(lock, timeoutMs, attempt - 1, seen)
        }
        // The lease starts before the CAS is posted: a waiter can only see our word later than this.
        const token = nextSequence(sequenceOf(expect))
        const word = this.#ownerBits | token
        const before = await bound.wait(this.qp.compareAndSwap(slot, expect, word))
        if (before === expect) {
          const grant: LockGrant = { lock, word, token, leaseEndsAt: leaseStart + this.leaseMs, stolenFrom: isFree(expect) ? undefined : expect, attempts: attempt }
          // A CAS answered after the lease ran out: a thief may hold a newer token already. Give it back, try again.
          if (performance.now() < grant.leaseEndsAt) return grant
          await this.release(grant).catch(ignore)
          expect = releasedWord(word)
          bound.last = FREE
          continue
        }
        bound.last = before
        if (isFree(before)) {
          this.#expectFree[lock] = expect = before // used since this client last saw it: try that word at once
          if (attempt < 3) continue
          await bound.wait(sleep(0)) // lost to other clients more than once: let the event loop run
          continue
        }
        const now = performance.now()
        // The waiter's clock starts when it has seen the value (after the holder's lease started).
        if (before !== seen) { seen = before; seenSince = now }
        else if (now - seenSince >= this.leaseMs + this.graceMs) { expect = before; continue } // steal next
        const stale = sequenceOf(before) !== sequenceOf(expect) // the lock changed hands since this client last looked
        expect = releasedWord(before) // what its holder's release will leave
        // After a sleep the word expected is usually stale (a busy holder releases and takes the lock again
        // many times in one backoff): try the fresh one once at once, else a waiter could only win if the
        // holder had not come back since its last look, and a busy holder would starve it.
        if (stale && !caughtUp) { caughtUp = true; continue }
        caughtUp = false
        const delay = backoffMs(backoffs++, this.maxBackoffMs)
        if (performance.now() + delay >= deadline) throw timedOut(lock, timeoutMs, attempt, before)
        await bound.wait(sleep(delay))
      }
    } finally {
      bound.end()
    }
  }

  /**
   * FIFO: takes a ticket (FETCH_ADD on the lock's counter) and, right behind
   * it on the same QP, reads the serving word (FETCH_ADD 0): an uncontended
   * acquire is one round trip. Then waits for its turn (ticket.ts). A wait
   * that ends (timeout, abort) forfeits the ticket: its turn is passed on.
   */
  async #acquireTicket(lock: number, slot: RemoteSlice, next: RemoteSlice, bound: Bound, deadline: number, timeoutMs: number): Promise<LockGrant> {
    let attempts = 0
    try {
      for (;;) {
        attempts++
        // Nobody can queue behind this ticket before its FETCH_ADD runs: the lease may start now.
        const postedAt = performance.now()
        const take = this.qp.fetchAndAdd(next, 1n)
        await undefined // the read goes in its own turn, right behind: both take the fast path
        const first = this.qp.fetchAndAdd(slot, 0n)
        first.catch(ignore)
        let ticket: bigint
        try {
          ticket = await bound.wait(take)
        } catch (error) {
          forfeit(this.#tickets, slot, take) // it may still have taken a ticket at the responder
          throw error
        }
        let turn
        try {
          turn = await waitForTurn(this.#tickets, slot, ticket, first, postedAt, deadlineBound(bound, deadline),
            (serving) => new RdmaError(`acquire of lock ${lock} timed out after ${timeoutMs} ms (${attempts} tickets; ticket ${ticket}, serving ${serving})`, { code: 'ERR_LOCK_TIMEOUT', verb: 'acquire' }))
        } catch (error) {
          forfeit(this.#tickets, slot, Promise.resolve(ticket))
          throw error
        }
        if (turn === 'skipped') continue // its turn came and went while it did not poll: queue again
        const grant: LockGrant = { lock, word: servingWord(ticket), token: ticket + 1n, leaseEndsAt: turn.leaseStart + this.leaseMs, stolenFrom: turn.stolenFrom, attempts }
        if (performance.now() < grant.leaseEndsAt) return grant
        await this.release(grant).catch(ignore)
        if (performance.now() >= deadline) throw new RdmaError(`acquire of lock ${lock} timed out after ${timeoutMs} ms (${attempts} tickets)`, { code: 'ERR_LOCK_TIMEOUT', verb: 'acquire' })
      }
    } finally {
      bound.end()
    }
  }

  /**
   * Gives the lock back: CAS(word -> the same sequence, no owner), in FIFO
   * mode CAS(word -> the next ticket's). ERR_LOCK_LOST if the word is no longer ours (the lease ran out
   * and it was stolen, or the queue moved on).
   */
  async release(grant: LockGrant, options: LockWaitOptions = NO_OPTIONS): Promise<void> {
    object(grant, 'grant')
    const slot = this.lockWord(grant.lock)
    const { signal, timeoutMs } = waitOptions(options) // before the CAS is posted: a refused call changes nothing
    const fifo = this.mode === 'fifo'
    const freed = fifo ? servingWord(ticketOf(grant.word) + 1n) : releasedWord(grant.word)
    const now = performance.now()
    if (fifo) this.#tickets.hold.observe(now - (grant.leaseEndsAt - this.leaseMs)) // since the turn's poll (or the last renew)
    // The hot path's one atomic: bounded here rather than through #bounded, one async function fewer.
    const bound = this.#watchdog.start(now + timeoutMs, signal, RELEASE_ERRORS, grant.lock, timeoutMs)
    let before
    try {
      before = await bound.wait(this.qp.compareAndSwap(slot, grant.word, freed))
    } finally {
      bound.end()
    }
    if (before !== grant.word) throw lost(grant, before, 'release', this.mode)
    if (!fifo) this.#expectFree[grant.lock] = freed
  }

  /** Extends the lease: CAS(word -> owner|next sequence; FIFO: the same ticket, next renewal), which restarts every waiter's count. Same token. */
  async renew(grant: LockGrant, options: LockWaitOptions = NO_OPTIONS): Promise<LockGrant> {
    object(grant, 'grant')
    const slot = this.lockWord(grant.lock)
    const wait = waitOptions(options)
    const word = this.mode === 'fifo' ? renewedWord(grant.word) : this.#ownerBits | nextSequence(sequenceOf(grant.word))
    const leaseStart = performance.now()
    if (leaseStart >= grant.leaseEndsAt) throw leaseExpired(grant)
    const before = await this.#bounded(RENEW_ERRORS, wait, leaseStart + wait.timeoutMs, this.qp.compareAndSwap(slot, grant.word, word))
    if (before !== grant.word) throw lost(grant, before, 'renew', this.mode)
    return { ...grant, word, leaseEndsAt: leaseStart + this.leaseMs }
  }

  /** Milliseconds of lease left (negative once it has run out). */
  leaseLeftMs(grant: LockGrant): number {
    return grant.leaseEndsAt - performance.now()
  }

  /** Throws ERR_LOCK_LEASE_EXPIRED unless at least `marginMs` of the lease is left: call before each protected write. */
  checkLease(grant: LockGrant, marginMs = 0): void {
    if (this.leaseLeftMs(grant) < marginMs) throw leaseExpired(grant)
  }

  /**
   * Installs `token` in a fence word on the data side (8 bytes, starts at 0):
   * CAS it up from whatever smaller token is there. Rejects with
   * ERR_LOCK_FENCED if a larger token is already installed, that is, if a
   * newer holder has fenced this data: the caller is a zombie and must not
   * write. The NIC does the comparison; see docs/locks.md for what it covers.
   */
  async fence(token: bigint, fenceWord: RemoteSlice, options: LockWaitOptions = NO_OPTIONS): Promise<void> {
    if (typeof token !== 'bigint' || token < 1n) throw typeError('a fencing token (bigint >= 1)', 'token', token)
    instance(fenceWord, 'fenceWord', RemoteSlice)
    const wait = waitOptions(options)
    const deadline = performance.now() + wait.timeoutMs
    let expect = 0n
    // Installed values only grow, so each retry sees a larger one: at most one retry per newer install.
    for (;;) {
      const before = await this.#bounded(FENCE_ERRORS, wait, deadline, this.qp.compareAndSwap(fenceWord, expect, token))
      if (before === expect || before === token) return
      if (before > token) {
        throw new RdmaError(`fencing token ${token} refused: the data is fenced by token ${before}`, { code: 'ERR_LOCK_FENCED', verb: 'fence' })
      }
      expect = before
    }
  }

  /**
   * One atomic of renew or fence, bounded by `deadline` (options.timeoutMs from the call's start: ETIMEDOUT)
   * and options.signal (ABORT_ERR). The options are checked (waitOptions) before the atomic is posted, never after.
   */
  async #bounded(errors: BoundErrors, wait: Wait, deadline: number, atomic: Promise<bigint>): Promise<bigint> {
    const bound = this.#watchdog.start(deadline, wait.signal, errors, -1, wait.timeoutMs)
    try {
      return await bound.wait(atomic)
    } finally {
      bound.end()
    }
  }

  /** FIFO: the ticket counter of lock `lock` (the constructor required `tokens` in that mode). */
  #tokenWord(lock: number): RemoteSlice {
    const tokens = this.#tokens!
    return this.#tokenSlices[lock] ??= tokens.region.slice(tokens.offset + lock * 8, 8)
  }
}

/** What every call without options waits: a default bound, no signal (nothing to check). */
const NO_OPTIONS: LockWaitOptions = Object.freeze({})

interface Wait { readonly signal: AbortSignal | undefined; readonly timeoutMs: number }
const DEFAULT_WAIT: Wait = Object.freeze({ signal: undefined, timeoutMs: DEFAULT_TIMEOUT })

/** The checked options of a call (nothing made for the default ones); its deadline is timeoutMs from the caller's performance.now(). */
function waitOptions(options: LockWaitOptions): Wait {
  if (options === NO_OPTIONS) return DEFAULT_WAIT
  const o = object(options, 'options')
  const timeoutMs = optionalInteger(o.timeoutMs, 'options.timeoutMs', 0, 2 ** 31 - 1, DEFAULT_TIMEOUT)
  const signal = o.signal === undefined ? undefined : instance(o.signal, 'options.signal', AbortSignal)
  return { signal, timeoutMs }
}

const ignore = (): void => {}
const sleep = (ms: number): Promise<void> => new Promise((resolve) => ms <= 0 ? setImmediate(resolve) : setTimeout(resolve, ms))

/** The errors of acquire's bound (the lock, its progress), and of one atomic of release, renew or fence. */
const ACQUIRE_ERRORS: BoundErrors = {
  timedOut: (bound) => timedOut(bound.lock, bound.timeoutMs, bound.attempts, bound.last),
  aborted: (bound) => aborted(bound.lock, bound.signal!),
}
const RELEASE_ERRORS = verbErrors('release')
const RENEW_ERRORS = verbErrors('renew')
const FENCE_ERRORS = verbErrors('fence')

function verbErrors(verb: string): BoundErrors {
  return {
    timedOut: (bound) => new RdmaError(`${verb} timed out after ${bound.timeoutMs} ms`, { code: 'ETIMEDOUT', verb }),
    aborted: (bound) => new RdmaError(`${verb} was aborted`, { code: 'ABORT_ERR', verb, cause: bound.signal!.reason }),
  }
}

function aborted(lock: number, signal: AbortSignal): RdmaError {
  return new RdmaError(`acquire of lock ${lock} was aborted`, { code: 'ABORT_ERR', verb: 'acquire', cause: signal.reason })
}

function timedOut(lock: number, timeoutMs: number, attempts: number, word: bigint): RdmaError {
  const holder = decodeWord(word)
  return new RdmaError(`acquire of lock ${lock} timed out after ${timeoutMs} ms (${attempts} attempts; last seen held by ${holder ? `owner ${holder.owner}` : 'nobody'})`,
    { code: 'ERR_LOCK_TIMEOUT', verb: 'acquire' })
}

function lost(grant: LockGrant, found: bigint, verb: string, mode: LockMode): RdmaError {
  const holder = decodeWord(found)
  const now = mode === 'fifo' ? `serving ticket ${ticketOf(found)}` : holder ? `owner ${holder.owner}` : 'free'
  return new RdmaError(`${verb}: lock ${grant.lock} is no longer held by this grant (found ${now}): its lease ran out`,
    { code: 'ERR_LOCK_LOST', verb })
}

function leaseExpired(grant: LockGrant): RdmaError {
  return new RdmaError(`the lease on lock ${grant.lock} (token ${grant.token}) has run out`, { code: 'ERR_LOCK_LEASE_EXPIRED', verb: 'checkLease' })
}
