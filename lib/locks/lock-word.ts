// The 8-byte lock word of a remote lock table (spin mode). It carries the
// lock's fencing counter, so one CAS both takes the lock and gives its token:
//
//   bits 63..48  owner (1..65535), 0 while the lock is free
//   bits 47..0   sequence: +1 at every acquisition, steal and renew
//
// A holder's fencing token is the sequence its acquisition wrote. Release
// clears only the owner: the sequence stays, so the next holder's token is
// larger, and every held value is unique (a steal compares the exact stale
// value: no ABA).
import { integer, rangeError } from '../core/validate.js'

/** The word of a table that was never used: free, sequence 0. */
export const FREE = 0n
export const MAX_OWNER = 0xffff
const SEQUENCE_BITS = 48n
const SEQUENCE_MASK = (1n << SEQUENCE_BITS) - 1n
/** The smallest held word (owner 1, sequence 0): a lock word (0..2^64-1) below it is free. */
const HELD = 1n << SEQUENCE_BITS

/** The value of a lock held by `owner` at sequence `sequence` (1..2^48-1). */
export function heldWord(owner: number, sequence: bigint): bigint {
  integer(owner, 'owner', 1, MAX_OWNER)
  if (typeof sequence !== 'bigint' || sequence < 1n || sequence > SEQUENCE_MASK) throw rangeError('a sequence from 1 to 2^48-1', 'sequence', sequence)
  return (BigInt(owner) << SEQUENCE_BITS) | sequence
}

/** Who holds a lock word, and its sequence (the holder's token, plus its renewals); undefined for a free lock. */
export function decodeWord(word: bigint): { owner: number; sequence: bigint } | undefined {
  if (isFree(word)) return undefined
  return { owner: Number(word >> SEQUENCE_BITS), sequence: word & SEQUENCE_MASK }
}

// The hot path compares rather than shifts or masks: a comparison allocates no BigInt.

/** No owner (whatever the sequence). */
export function isFree(word: bigint): boolean { return word >= 0n && word < HELD }

/** The sequence a lock word carries. */
export function sequenceOf(word: bigint): bigint { return word >= 0n && word < HELD ? word : word & SEQUENCE_MASK }

/** The word `word` becomes when its holder releases it: same sequence, no owner. */
export function releasedWord(word: bigint): bigint { return word & SEQUENCE_MASK }

/** The sequence after `sequence`, wrapping from 2^48-1 to 1 (after 2.8 * 10^14 acquisitions of one lock). */
export function nextSequence(sequence: bigint): bigint {
  return sequence >= SEQUENCE_MASK ? 1n : sequence + 1n
}

/**
 * The delay before retry number `attempt` (0-based) of a bounded exponential
 * backoff: 0 (yield to the event loop) for the first tries, then doubling
 * from 1 ms up to `maxMs`, with jitter in [half, full] so that waiters spread out.
 */
export function backoffMs(attempt: number, maxMs: number, random: () => number = Math.random): number {
  const spins = 2
  if (attempt < spins) return 0
  const ceiling = Math.min(maxMs, 2 ** (attempt - spins))
  return ceiling / 2 + random() * (ceiling / 2)
}
