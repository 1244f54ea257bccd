// 64-bit values to words and from bytes (the atomics' operands and results),
// without BigInt arithmetic above 2^32: every value round-trips exactly.
import { describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { readU64LE, smallU64, writeOperand, writeU64 } from '../../lib/core/u64.js'
import { thrown } from './thrown.js'

const fromWords = (w: Uint32Array, at: number) => BigInt(w[at]!) | (BigInt(w[at + 1]!) << 32n)
const leBytes = (value: bigint) => { const b = new Uint8Array(8); new DataView(b.buffer).setBigUint64(0, value, true); return b }
const EDGES = [0n, 1n, 0xffffffffn, 0x1_0000_0000n, 0x1_0000_0001n, 2n ** 63n, 2n ** 64n - 1n]

describe('64-bit values', () => {
  it('writeU64 puts the low word first, for the edges and any value below 2^64', () => {
    const w = new Uint32Array(4)
    for (const value of EDGES) {
      writeU64(w, 1, value)
      expect(fromWords(w, 1)).toBe(value)
    }
    fc.assert(fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), (value) => { writeU64(w, 2, value); return fromWords(w, 2) === value }))
  })

  it('readU64LE reads little-endian bytes at any offset, for the edges and any value below 2^64', () => {
    const bytes = new Uint8Array(16)
    for (const value of EDGES) {
      bytes.set(leBytes(value), 3)
      expect(readU64LE(bytes, 3)).toBe(value)
    }
    fc.assert(fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), fc.integer({ min: 0, max: 8 }), (value, at) => {
      bytes.fill(0xa5)
      bytes.set(leBytes(value), at)
      return readU64LE(bytes, at) === value
    }))
  })

  it('smallU64 + writeOperand write every operand below 2^64 exactly: a number below 2^32, -1 above', () => {
    const w = new Uint32Array(4)
    for (const value of EDGES) {
      const small = smallU64(value, 'add')
      expect(small).toBe(value <= 0xffffffffn ? Number(value) : -1)
      writeOperand(w, 1, value, small)
      expect(fromWords(w, 1)).toBe(value)
    }
    fc.assert(fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), (value) => { w.fill(7); writeOperand(w, 2, value, smallU64(value, 'add')); return fromWords(w, 2) === value }))
  })

  it('smallU64 refuses what uint64() refuses, with its codes', () => {
    expect(thrown(() => smallU64(-1n, 'add'))).toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    expect(thrown(() => smallU64(2n ** 64n, 'swap'))).toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    expect(thrown(() => smallU64(5, 'compare'))).toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    expect(thrown(() => smallU64(undefined, 'compare'))).toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
  })
})
