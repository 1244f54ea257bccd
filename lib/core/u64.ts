// 64-bit values between bigints and 32-bit words or bytes, for the atomics'
// operands and results. Above 2^32 a bigint goes through a BigUint64Array
// cell: BigInt `&`, `>>`, `<<` and `|` each allocate a BigInt in a runtime
// call (counted in the guest: a compare-and-swap with operands above 2^32
// cost about 1k more instructions that way; docs/benchmarks.md).
import { uint64 } from './validate.js'

const CELL = new BigUint64Array(1)
const CELL_WORDS = new Uint32Array(CELL.buffer)
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1
/** Index of the low word in CELL_WORDS. */
const LO = LITTLE_ENDIAN ? 0 : 1

/** Writes `value` (0 ≤ value < 2^64) as two words, low first; below 2^32 (the usual operands) no BigInt is made. */
export function writeU64(w: Uint32Array, at: number, value: bigint): void {
  if (value >= 0n && value <= 0xffffffffn) {
    w[at] = Number(value)
    w[at + 1] = 0
  } else {
    CELL[0] = value
    w[at] = CELL_WORDS[LO]!
    w[at + 1] = CELL_WORDS[1 - LO]!
  }
}

/**
 * Checks an operand the caller gave as uint64() does (a bigint 0 .. 2^64-1,
 * else it throws) and returns it as a number when below 2^32, the usual case,
 * else -1. writeOperand() then writes a small one with no more BigInt work.
 * One conversion and number comparisons: each BigInt comparison is a builtin
 * call (uint64() then writeU64() of an operand and of a zero made six).
 */
export function smallU64(value: unknown, name: string): number {
  if (typeof value === 'bigint') {
    const n = Number(value) // exact below 2^53, so a result from 0 to 2^32-1 is the value itself
    if (n >= 0 && n <= 0xffffffff) return n
  }
  uint64(value, name)
  return -1
}

/** Writes an operand checked by smallU64(): `small` when it is not -1, else `value`. */
export function writeOperand(w: Uint32Array, at: number, value: bigint, small: number): void {
  if (small >= 0) {
    w[at] = small
    w[at + 1] = 0
  } else {
    writeU64(w, at, value)
  }
}

/** The little-endian 64-bit value at bytes[at..at+8). */
export function readU64LE(bytes: Uint8Array, at: number): bigint {
  const lo = (bytes[at]! | (bytes[at + 1]! << 8) | (bytes[at + 2]! << 16) | (bytes[at + 3]! << 24)) >>> 0
  const hi = (bytes[at + 4]! | (bytes[at + 5]! << 8) | (bytes[at + 6]! << 16) | (bytes[at + 7]! << 24)) >>> 0
  if (hi === 0) return BigInt(lo)
  CELL_WORDS[LO] = lo
  CELL_WORDS[1 - LO] = hi
  return CELL[0]!
}
