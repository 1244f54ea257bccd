// Layer 6: native memory above 4 GiB, without a device. A Node 20 ArrayBuffer
// over external memory holds at most 2^32 bytes; asking for more once aborted
// the process (a double free in the view's finalizer data). The memory is
// mapped lazily, so these tests touch only the pages they write.
import { describe, expect, it } from 'vitest'
import { thrown } from './thrown.js'
import { native } from '../../dist/native/addon.js'
import { NativeMemory } from '../../dist/index.js'

const MAX_VIEW_BYTES = NativeMemory.MAX_VIEW_BYTES

const GiB = 2 ** 30
const BIG = 4 * GiB + 4096

describe('native memory above 4 GiB', () => {
  it('a view of more than 4 GiB is refused with ERR_VIEW_TOO_LARGE, not a crash', () => {
    const buffer = new native.NativeBuffer(BIG)
    const e = thrown(() => buffer.view())
    expect(e.code).toBe('ERR_VIEW_TOO_LARGE')
    expect(e.message).toMatch(/window/)
  })

  it('NativeMemory.bytes says to use a window; windows past 4 GiB share the memory', () => {
    expect(MAX_VIEW_BYTES).toBe(2 ** 32)
    const memory = new NativeMemory(BIG)
    expect(memory.size).toBe(BIG)
    expect(thrown(() => memory.bytes).code).toBe('ERR_VIEW_TOO_LARGE')
    const tail = memory.window(4 * GiB, 4096)
    expect(tail.byteLength).toBe(4096)
    expect(tail.every((b) => b === 0)).toBe(true) // zero-filled
    tail.fill(0xa5)
    const across = memory.window(4 * GiB - 2, 4)
    expect(Array.from(across)).toEqual([0, 0, 0xa5, 0xa5])
    expect(memory.window(0, MAX_VIEW_BYTES).byteLength).toBe(MAX_VIEW_BYTES)
  })

  it('bad windows and sizes throw coded errors', () => {
    const memory = new NativeMemory(8192)
    expect(thrown(() => memory.window(8192, 1)).code).toBe('ERR_OUT_OF_RANGE')
    expect(thrown(() => memory.window(-1, 1)).code).toBe('ERR_OUT_OF_RANGE')
    const buffer = new native.NativeBuffer(8192)
    for (const [offset, length] of [[8193, 0], [0, 8193], [4096, 4097], [-1, 1], [0.5, 1], [0, NaN]]) {
      expect(thrown(() => buffer.view(offset, length)).code).toBe('ERR_OUT_OF_RANGE')
    }
    expect(new Uint8Array(buffer.view(4096, 4096)).byteLength).toBe(4096)
    // More than the address space can map: ENOMEM from mmap, never a crash.
    const e = thrown(() => new NativeMemory(2 ** 52))
    expect(e.code).toBe('ENOMEM')
    expect(e.syscall).toBe('mmap')
  })
})
