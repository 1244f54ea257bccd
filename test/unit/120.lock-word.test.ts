// The lock word encoding and the backoff schedule of lib/locks (pure logic).
import { describe, expect, it } from 'vitest'
import { decodeWord, heldWord } from '../../dist/index.js'
import { backoffMs, isFree, nextSequence, releasedWord, sequenceOf } from '../../dist/locks/lock-word.js'

describe('lock words', () => {
  it('pack owner and sequence so that every held word is nonzero and decodes back', () => {
    const word = heldWord(0xffff, (1n << 48n) - 1n)
    expect(word).toBe(0xffffffffffffffffn)
    expect(decodeWord(word)).toEqual({ owner: 0xffff, sequence: (1n << 48n) - 1n })
    expect(decodeWord(heldWord(1, 1n))).toEqual({ owner: 1, sequence: 1n })
    expect(decodeWord(0n)).toBeUndefined()
  })

  it('a release keeps the sequence (the next token is larger); a free word is any word without owner', () => {
    const held = heldWord(7, 41n)
    const free = releasedWord(held)
    expect(free).toBe(41n)
    expect(isFree(free)).toBe(true)
    expect(isFree(held)).toBe(false)
    expect(decodeWord(free)).toBeUndefined()
    expect(sequenceOf(free)).toBe(41n)
    // The next acquisition, by anyone, writes sequence 42: its token is larger than the last holder's.
    expect(sequenceOf(heldWord(9, nextSequence(sequenceOf(free))))).toBe(42n)
  })

  it('refuse owner 0 and sequences outside 1..2^48-1 (a held word must never equal a free one or another owner\'s)', () => {
    expect(() => heldWord(0, 1n)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(() => heldWord(65536, 1n)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(() => heldWord(1, 0n)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(() => heldWord(1, 1n << 48n)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(nextSequence((1n << 48n) - 1n)).toBe(1n)
  })
})

describe('backoff', () => {
  it('yields first, then doubles from 1 ms to the cap, with jitter in [half, full]', () => {
    const low = (a: number) => backoffMs(a, 16, () => 0)
    const high = (a: number) => backoffMs(a, 16, () => 1)
    expect([0, 1].map(high)).toEqual([0, 0])
    expect([2, 3, 4, 5, 6, 7, 50].map(high)).toEqual([1, 2, 4, 8, 16, 16, 16])
    expect([2, 3, 6, 50].map(low)).toEqual([0.5, 1, 8, 8])
  })
})
