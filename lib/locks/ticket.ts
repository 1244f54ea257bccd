// FIFO mode of a remote lock table (options.mode 'fifo'): a ticket lock on
// one-sided atomics, as DSLR builds its queue from FETCH_ADD. The table's two
// words per lock mean:
//
//   tokens[lock]  the next ticket: FETCH_ADD(+1) takes one (ticket + 1 is the fencing token)
//   locks[lock]   now serving: ticket << 16 | renewals (mod 2^16)
//
// A client holds the lock while the serving word carries its ticket.
// Release and steal move the serving word on by one with a CAS on its exact
// value, so they never race each other or a renew; arrivals touch only the
// ticket word. Waiters poll the serving word (FETCH_ADD 0: an atomic read)
// and grants come in ticket order, so no waiter is starved. A waiter that
// gives up passes its turn on when it comes (forfeit below); a client that
// dies holding or waiting costs the queue one lease + grace, after which the
// next waiter moves it on (the same lease rule as the spin lock's steal).
import { performance } from 'node:perf_hooks'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { RemoteSlice } from '../verbs/remote.js'
import type { Bound } from './bounded.js'
import { backoffMs } from './lock-word.js'

const RENEW_BITS = 16n
const RENEW_MASK = (1n << RENEW_BITS) - 1n

/** The serving word that grants the lock to `ticket`. */
export function servingWord(ticket: bigint): bigint { return ticket << RENEW_BITS }
/** The ticket a serving word grants the lock to. */
export function ticketOf(word: bigint): bigint { return word >> RENEW_BITS }
/** The serving word after a renew: the same ticket, a changed value (waiters restart their count). */
export function renewedWord(word: bigint): bigint { return servingWord(ticketOf(word)) | ((word + 1n) & RENEW_MASK) }

export interface TicketTable {
  readonly qp: QueuePair
  readonly leaseMs: number
  readonly graceMs: number
  readonly maxBackoffMs: number
  /** How long this client holds the lock: the length of a turn that waiters plan their polls by. */
  readonly hold: HoldTime
}

/** Weight of each new sample in the running average. */
const ALPHA = 0.3

/**
 * How long this client holds the lock, a running average of its holds (from
 * the turn's poll to release()): what a waiter takes a turn to last. A
 * waiter sleeps most of the turns ahead of it instead of polling at a fixed
 * rate: the one next in line polls near the end of the holder's turn, and
 * the ones further back do not spend atomics (on rxe: the CPU the holder
 * needs) on polls that cannot show their turn. Holds, not the gaps a waiter
 * sees between serving words: those include the waiter's own sleep and
 * wake-up, and an estimate made of them grows with every late poll.
 */
export class HoldTime {
  /** Milliseconds per hold; 0 until this client held the lock. */
  ms = 0

  /** A hold of `ms`. */
  observe(ms: number): void {
    if (!(ms >= 0)) return
    this.ms = this.ms === 0 ? ms : this.ms + ALPHA * (ms - this.ms)
  }
}

/** The turn of a ticket: when its lease may start, and the word it took over when it moved a silent holder on. */
export interface Turn { leaseStart: number; stolenFrom: bigint | undefined }

/** How a wait ends early: the bound's error, or undefined to wait for as long as it takes (a forfeit). */
export interface TurnBound {
  wait<T>(promise: Promise<T>): Promise<T>
  /** Whether `delay` ms from now passes the deadline. */
  passes(delay: number): boolean
  readonly unrefSleeps: boolean
}

/**
 * Waits until the serving word reaches `ticket` (polled with FETCH_ADD 0,
 * `first` being the poll already posted at `postedAt`). Resolves with the
 * turn, or 'skipped' when the queue went past the ticket (its turn came and
 * went silent for a lease + grace: only if this client polled too rarely).
 * A serving word that stays the same for leaseMs + graceMs of this client's
 * clock belongs to a client that went silent: it is moved on by one with a
 * CAS on that exact word. `onTimeout` makes the error when the bound's
 * deadline would pass (the caller forfeits the ticket).
 */
export async function waitForTurn(t: TicketTable, slot: RemoteSlice, ticket: bigint, first: Promise<bigint>, postedAt: number,
  bound: TurnBound, onTimeout: (serving: bigint) => Error): Promise<Turn | 'skipped'> {
  let poll = first
  let seen = -1n // the serving word as last seen, and since when (the lease rule)
  let seenSince = 0
  let turn = -1n // the ticket served as last seen, and since when
  let turnSince = 0
  let attempt = 0
  for (;;) {
    const word = await bound.wait(poll)
    const serving = ticketOf(word)
    const now = performance.now()
    if (serving !== turn) {
      turn = serving
      turnSince = now
      attempt = 0
    }
    // The serving word reached the ticket after the last poll that showed less executed, so after that
    // poll was posted: a lease from then is never longer than the one other waiters count.
    if (serving === ticket) return { leaseStart: postedAt, stolenFrom: undefined }
    if (serving > ticket) return 'skipped'
    if (word !== seen) {
      seen = word
      seenSince = now
    } else if (now - seenSince >= t.leaseMs + t.graceMs) {
      const movedAt = performance.now()
      const before = await bound.wait(t.qp.compareAndSwap(slot, word, servingWord(serving + 1n)))
      if (before === word && serving + 1n === ticket) return { leaseStart: movedAt, stolenFrom: word }
      postedAt = performance.now()
      poll = t.qp.fetchAndAdd(slot, 0n)
      continue
    }
    const delay = pollDelay(t, Number(ticket - serving), now - turnSince, attempt++)
    if (bound.passes(delay)) throw onTimeout(serving)
    await bound.wait(sleep(delay, bound.unrefSleeps))
    postedAt = performance.now()
    poll = t.qp.fetchAndAdd(slot, 0n)
  }
}

/** The share of the turns ahead a waiter sleeps before it polls (see pollDelay). */
const EARLY = 0.75

/**
 * The sleep before the next poll of a waiter `ahead` tickets behind the one
 * served, `since` ms after it saw that ticket's turn begin, at its
 * `attempt`th poll of it, turns taken to last as long as this client's own
 * holds: three quarters of what should remain of the turns ahead (the poll
 * lands before their estimated end). Next in line, it polls at least every
 * eighth of a turn (or as the spin lock retries, once that is longer);
 * further back, every quarter of a turn at most. Never longer than
 * 8 x maxBackoffMs or a quarter of the lease (a silent holder is still moved
 * on in time). A client that has not held the lock yet polls as the spin
 * lock retries when next in line, else every maxBackoffMs.
 */
export function pollDelay(t: TicketTable, ahead: number, since: number, attempt: number): number {
  const turn = t.hold.ms
  if (turn === 0) return ahead === 1 ? backoffMs(attempt, t.maxBackoffMs) : t.maxBackoffMs
  const early = EARLY * (ahead * turn - since)
  const least = ahead === 1 ? Math.max(turn / 8, backoffMs(attempt, t.maxBackoffMs)) : turn / 4
  return Math.min(Math.max(early, least), 8 * t.maxBackoffMs, t.leaseMs / 4)
}

/** A bound made of the acquire's Bound and deadline. */
export function deadlineBound(bound: Bound, deadline: number): TurnBound {
  return { wait: (promise) => bound.wait(promise), passes: (delay) => performance.now() + delay >= deadline, unrefSleeps: false }
}

const unbounded: TurnBound = { wait: (promise) => promise, passes: () => false, unrefSleeps: true }

/**
 * A ticket whose waiter gave up (timeout, abort): waits for its turn in the
 * background and passes it on at once, so the queue behind it does not wait
 * a lease for it. Its sleeps do not keep the process alive; if the process
 * exits first, the next waiter moves the queue on after a lease + grace.
 */
export function forfeit(t: TicketTable, slot: RemoteSlice, ticket: Promise<bigint>): void {
  void (async () => {
    const mine = await ticket
    const turn = await waitForTurn(t, slot, mine, t.qp.fetchAndAdd(slot, 0n), performance.now(), unbounded, () => new Error('unbounded'))
    if (turn !== 'skipped') await t.qp.compareAndSwap(slot, servingWord(mine), servingWord(mine + 1n))
  })().catch(() => { /* the QP failed or closed: nobody is left to pass the turn to through it */ })
}

function sleep(ms: number, unref: boolean): Promise<void> {
  return new Promise((resolve) => {
    if (ms <= 0) return setImmediate(resolve)
    const timer = setTimeout(resolve, ms)
    if (unref) timer.unref()
  })
}
