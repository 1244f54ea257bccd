// Layer 2: remote memory descriptors and the slices work requests name.
// Pure JS: no device needed.
import { describe, expect, it } from 'vitest'
import { thrown } from './thrown.js'
import { remoteRegion, RemoteRegion, RemoteSlice } from '../../dist/index.js'
import type { RemoteBytes } from '../../lib/ops/encoder.js'

/** The address's 32-bit words the encoder writes: @internal, so dist's .d.ts leaves them out; they are there at run time. */
const words = <R extends RemoteRegion | RemoteSlice>(r: R) => r as R & Pick<RemoteBytes, 'addrHi' | 'addrLo'>


describe('remoteRegion()', () => {
  const descriptor = { version: 1 as const, addr: '0x7f0011223344', rkey: 0x1234abcd, length: 65536 }

  it('turns a descriptor that went through JSON into a RemoteRegion', () => {
    const region = remoteRegion(JSON.parse(JSON.stringify(descriptor)))
    expect(region).toBeInstanceOf(RemoteRegion)
    expect(region.addr).toBe(0x7f0011223344n)
    expect(region.rkey).toBe(0x1234abcd)
    expect(region.length).toBe(65536)
    expect(words(region).addrHi).toBe(0x7f00)
    expect(words(region).addrLo).toBe(0x11223344)
  })

  it('round-trips through describe() and JSON', () => {
    const region = remoteRegion(descriptor)
    expect(region.describe()).toEqual(descriptor)
    const again = remoteRegion(JSON.parse(JSON.stringify(region.describe())))
    expect(again.addr).toBe(region.addr)
    expect(again.describe()).toEqual(descriptor)
  })

  it('accepts upper-case hex and normalises it in describe()', () => {
    const region = remoteRegion({ ...descriptor, addr: '0x7F0011223344' })
    expect(region.addr).toBe(0x7f0011223344n)
    expect(region.describe().addr).toBe('0x7f0011223344')
  })

  it('keeps 64-bit addresses above 2^53 exact', () => {
    const region = remoteRegion({ version: 1, addr: '0xffff800000001000', rkey: 7, length: 8192 })
    expect(region.addr).toBe(0xffff800000001000n)
    expect(words(region).addrHi).toBe(0xffff8000)
    expect(words(region).addrLo).toBe(0x00001000)
    expect(region.describe().addr).toBe('0xffff800000001000')
    const slice = region.slice(0x10, 8)
    expect(slice.addr).toBe(0xffff800000001010n)
    expect(words(slice).addrHi).toBe(0xffff8000)
    expect(words(slice).addrLo).toBe(0x1010)
    const max = remoteRegion({ version: 1, addr: '0xffffffffffffffff', rkey: 0, length: 1 })
    expect(max.addr).toBe(0xffffffffffffffffn)
    expect(max.slice(0).addr).toBe(0xffffffffffffffffn)
  })

  it('accepts the extremes of rkey and a zero length', () => {
    expect(remoteRegion({ ...descriptor, rkey: 0 }).rkey).toBe(0)
    expect(remoteRegion({ ...descriptor, rkey: 0xffffffff }).rkey).toBe(0xffffffff)
    expect(remoteRegion({ ...descriptor, length: 0 }).length).toBe(0)
  })

  it.each([
    [null, TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected an object for descriptor but received null'],
    ['{"version":1}', TypeError, 'ERR_INVALID_ARG_TYPE', /^Expected an object for descriptor but received '/],
    [[], TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected an object for descriptor but received an instance of Array'],
    [{ ...descriptor, version: 2 }, TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected version 1 for descriptor.version but received 2'],
    [{ ...descriptor, version: '1' }, TypeError, 'ERR_INVALID_ARG_TYPE', "Expected version 1 for descriptor.version but received '1'"],
    [{ ...descriptor, addr: 0x1000 }, TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected a hex address string for descriptor.addr but received 4096'],
    [{ ...descriptor, addr: 0x1000n }, TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected a hex address string for descriptor.addr but received 4096n'],
    [{ ...descriptor, addr: '4096' }, TypeError, 'ERR_INVALID_ARG_TYPE', /descriptor\.addr but received '4096'/],
    [{ ...descriptor, addr: '0x' }, TypeError, 'ERR_INVALID_ARG_TYPE', /descriptor\.addr/],
    [{ ...descriptor, addr: '0x1ffffffffffffffff' }, TypeError, 'ERR_INVALID_ARG_TYPE', /descriptor\.addr/], // 17 digits: > 64 bits
    [{ ...descriptor, addr: '0xfg' }, TypeError, 'ERR_INVALID_ARG_TYPE', /descriptor\.addr/],
    [{ ...descriptor, rkey: '5' }, TypeError, 'ERR_INVALID_ARG_TYPE', "Expected an integer for descriptor.rkey but received '5'"],
    [{ ...descriptor, rkey: -1 }, RangeError, 'ERR_OUT_OF_RANGE', 'Expected an integer from 0 to 4294967295 for descriptor.rkey but received -1'],
    [{ ...descriptor, rkey: 2 ** 32 }, RangeError, 'ERR_OUT_OF_RANGE', /descriptor\.rkey but received 4294967296$/],
    [{ ...descriptor, rkey: 1.5 }, RangeError, 'ERR_OUT_OF_RANGE', /descriptor\.rkey/],
    [{ ...descriptor, length: undefined }, TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected an integer for descriptor.length but received undefined'],
    [{ ...descriptor, length: -1 }, RangeError, 'ERR_OUT_OF_RANGE', /descriptor\.length/],
    [{ ...descriptor, length: 2 ** 53 }, RangeError, 'ERR_OUT_OF_RANGE', /descriptor\.length/],
  ])('rejects %o', (input, type, code, message) => {
    const error = thrown(() => remoteRegion(input))
    expect(error).toBeInstanceOf(type)
    expect(error.code).toBe(code)
    if (typeof message === 'string') expect(error.message).toBe(message)
    else expect(error.message).toMatch(message)
  })
})

describe('RemoteRegion.slice()', () => {
  const region = remoteRegion({ version: 1, addr: '0x1000', rkey: 99, length: 256 })

  it('defaults to the whole region', () => {
    const slice = region.slice()
    expect(slice).toBeInstanceOf(RemoteSlice)
    expect(slice.offset).toBe(0)
    expect(slice.length).toBe(256)
    expect(slice.addr).toBe(0x1000n)
    expect(slice.rkey).toBe(99)
    expect(slice.region).toBe(region)
  })

  it('runs to the end when no length is given', () => {
    const slice = region.slice(200)
    expect(slice.length).toBe(56)
    expect(slice.addr).toBe(0x1000n + 200n)
  })

  it('allows an empty slice at the very end', () => {
    const slice = region.slice(256)
    expect(slice.length).toBe(0)
    expect(slice.addr).toBe(0x1100n)
    expect(region.slice(256, 0).length).toBe(0)
  })

  it('carries from the low word into the high word across 2^32', () => {
    const big = remoteRegion({ version: 1, addr: '0x1fffffff0', rkey: 1, length: 0x100 })
    expect(words(big).addrHi).toBe(1)
    expect(words(big).addrLo).toBe(0xfffffff0)
    const slice = big.slice(0x20, 8)
    expect(words(slice).addrHi).toBe(2)
    expect(words(slice).addrLo).toBe(0x10)
    expect(slice.addr).toBe(0x200000010n)
    // Just below and exactly at the boundary.
    expect(words(big.slice(0x0f, 1)).addrHi).toBe(1)
    expect(words(big.slice(0x0f, 1)).addrLo).toBe(0xffffffff)
    expect(words(big.slice(0x10, 1)).addrHi).toBe(2)
    expect(words(big.slice(0x10, 1)).addrLo).toBe(0)
  })

  it('carries for offsets of several times 2^32', () => {
    const huge = remoteRegion({ version: 1, addr: '0x7f00ffffff00', rkey: 1, length: 2 ** 40 })
    const offset = 3 * 2 ** 32 + 0x200
    const slice = huge.slice(offset, 16)
    expect(slice.addr).toBe(0x7f00ffffff00n + BigInt(offset))
    expect(words(slice).addrHi).toBe(Number(slice.addr >> 32n))
    expect(words(slice).addrLo).toBe(Number(slice.addr & 0xffffffffn))
  })

  it.each([
    [[257], RangeError, 'ERR_OUT_OF_RANGE', 'Expected an integer from 0 to 256 for offset but received 257'],
    [[0, 257], RangeError, 'ERR_OUT_OF_RANGE', 'Expected an integer from 0 to 256 for length but received 257'],
    [[200, 57], RangeError, 'ERR_OUT_OF_RANGE', 'Expected an integer from 0 to 56 for length but received 57'],
    [[-1], RangeError, 'ERR_OUT_OF_RANGE', /for offset but received -1$/],
    [[0.5], RangeError, 'ERR_OUT_OF_RANGE', /for offset but received 0.5$/],
    [[0, -1], RangeError, 'ERR_OUT_OF_RANGE', /for length but received -1$/],
    [['8'], TypeError, 'ERR_INVALID_ARG_TYPE', "Expected an integer for offset but received '8'"],
    [[0, 8n], TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected an integer for length but received 8n'],
    [[0, null], TypeError, 'ERR_INVALID_ARG_TYPE', 'Expected an integer for length but received null'],
  ])('rejects slice(%o)', (args, type, code, message) => {
    const error = thrown(() => (region.slice as (...a: unknown[]) => unknown)(...args))
    expect(error).toBeInstanceOf(type)
    expect(error.code).toBe(code)
    if (typeof message === 'string') expect(error.message).toBe(message)
    else expect(error.message).toMatch(message)
  })
})

describe('RemoteRegion', () => {
  it('can be built directly from a bigint address', () => {
    const region = new RemoteRegion(0x123456789abcn, 5, 64)
    expect(region.describe()).toEqual({ version: 1, addr: '0x123456789abc', rkey: 5, length: 64 })
    expect(remoteRegion(region.describe()).addr).toBe(0x123456789abcn)
  })
})
