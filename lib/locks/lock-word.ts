// The 8-byte lock word of a remote lock table: 0 means free; a held lock
// stores who holds it and which acquisition this is, so that every held value
// is unique (a steal compares the exact stale value: no ABA).
//
//   bits 63..48  owner (1..65535)
//   bits 47..0   lease epoch: the holder's own acquisition counter
import { integer, rangeError } from '../core/validate.js'

export const FREE = 0n
export const MAX_OWNER = 0xffff
const EPOCH_BITS = 48n
const EPOCH_MASK = (1n << EPOCH_BITS) - 1n

/** The value of a lock held by `owner` in lease epoch `epoch`. */
export function heldWord(owner: number, epoch: bigint): bigint {
  integer(owner, 'owner', 1, MAX_OWNER)
  if (epoch < 1n || epoch > EPOCH_MASK) throw rangeError('an epoch from 1 to 2^48-1', 'epoch', epoch)
  return (BigInt(owner) << EPOCH_BITS) | epoch
}

/** Who holds a lock word, and in which epoch; undefined for a free lock. */
export function decodeWord(word: bigint): { owner: number; epoch: bigint } | undefined {
  if (word === FREE) return undefined
  return { owner: Number(word >> EPOCH_BITS), epoch: word & EPOCH_MASK }
}

/** The epoch after `epoch`, wrapping from 2^48-1 to 1 (0 would make the word of owner 0... never: owner >= 1). */
export function nextEpoch(epoch: bigint): bigint {
  return epoch >= EPOCH_MASK ? 1n : epoch + 1n
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
