// Layer 5: the addon's classes called directly, the way only a buggy caller
// would: objects of the wrong kind must be refused by their type tag (an
// exception, never a crash), and NativeBuffer memory must be refcounted.
import { describe, expect, it } from 'vitest'
import { thrown } from './thrown.js'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { native } from '../../dist/native/addon.js'


const wrongKind = () => new native.NativeBuffer(4096)
const anyNative = native as any

describe('native classes refuse objects of the wrong kind', () => {
  it.each([
    ['{}', () => ({})],
    ['a NativeBuffer', wrongKind],
    ['a number', () => 42],
    ['an ArrayBuffer', () => new ArrayBuffer(8)],
  ])('ProtectionDomain(%s) throws ERR_INVALID_ARG_TYPE', (_label, make) => {
    const e = thrown(() => new anyNative.ProtectionDomain(make()))
    expect(e).toBeInstanceOf(Error)
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(e.message).toBe('Expected a Context')
  })

  it('MemoryRegion(pd = NativeBuffer, ...) throws ERR_INVALID_ARG_TYPE', () => {
    const buffer = wrongKind()
    const e = thrown(() => new anyNative.MemoryRegion(buffer, buffer, 1))
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(e.message).toBe('Expected a ProtectionDomain')
  })

  it('MemoryRegion(pd = a plain object with a handle, ...) is not fooled by duck typing', () => {
    const e = thrown(() => new anyNative.MemoryRegion({ handle: 1, close() {} }, new ArrayBuffer(64), 1))
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
  })

  it('a ProtectionDomain needs a device', () => {
    expect(thrown(() => new anyNative.ProtectionDomain()).code).toBe('ERR_INVALID_ARG_TYPE')
  })

  it('an empty QueuePair wrapper (the kind rdma_cm fills in) is treated as closed', () => {
    const empty = new anyNative.QueuePair()
    expect(thrown(() => empty.qpn).code).toBe('ERR_CLOSED')
    expect(() => empty.close()).not.toThrow()
    const e = thrown(() => empty.postSend(new Uint32Array(16), 1))
    expect(e.code).toBe('ERR_CLOSED')
    expect(e.message).toBe('QueuePair is closed')
  })

  it.each([
    ['CompletionQueue', () => new anyNative.CompletionQueue(wrongKind(), 16, new Uint32Array(16), () => {}, 0), 'Expected a Context'],
    ['QueuePair', () => new anyNative.QueuePair(wrongKind(), {}), 'Expected a ProtectionDomain'],
    ['SharedReceiveQueue', () => new anyNative.SharedReceiveQueue(wrongKind(), 1, 1, 0), 'Expected a ProtectionDomain'],
    ['AddressHandle', () => new anyNative.AddressHandle(wrongKind(), {}), 'Expected a ProtectionDomain'],
    ['MemoryWindow', () => new anyNative.MemoryWindow(wrongKind(), 2), 'Expected a ProtectionDomain'],
    ['ProtectionDomain given a QueuePair', () => new anyNative.ProtectionDomain(new anyNative.QueuePair()), 'Expected a Context'],
  ])('%s with a wrong parent throws ERR_INVALID_ARG_TYPE', (_name, make, message) => {
    const e = thrown(make)
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(e.message).toBe(message)
  })

  it('Context(name) wants a string', () => {
    const e = thrown(() => new anyNative.Context(42))
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(e.message).toBe('Expected a string for name')
  })

  it('an empty QueuePair wrapper refuses every operation with ERR_CLOSED', () => {
    const qp = new anyNative.QueuePair()
    expect(thrown(() => qp.qpn).code).toBe('ERR_CLOSED')
    expect(thrown(() => qp.postSend(new Uint32Array(16), 1)).code).toBe('ERR_CLOSED')
    expect(thrown(() => qp.modify({ qpState: 1 })).code).toBe('ERR_CLOSED')
    expect(() => qp.close()).not.toThrow()
  })
})

describe('NativeBuffer', () => {
  it.each([0, -1, NaN, 'x', 1.5, Infinity, undefined])('rejects size %s with ERR_OUT_OF_RANGE', (size) => {
    const e = thrown(() => new anyNative.NativeBuffer(size))
    expect(e).toBeInstanceOf(Error)
    expect(e.code).toBe('ERR_OUT_OF_RANGE')
    expect(e.message).toBe('Expected a size of at least 1 byte')
  })

  it('gives page-aligned, zero-filled memory of the exact size', () => {
    for (const size of [1, 100, 4096, 4097, 65536 + 3]) {
      const buffer = new native.NativeBuffer(size)
      expect(buffer.size).toBe(size)
      expect(buffer.address % 4096).toBe(0)
      expect(buffer.address).toBeGreaterThan(0)
      const view = new Uint8Array(buffer.view())
      expect(view.byteLength).toBe(size)
      expect(view.every((b) => b === 0)).toBe(true)
      buffer.release()
    }
  })

  it('hands out views over the same memory', () => {
    const buffer = new native.NativeBuffer(4096)
    const a = new Uint8Array(buffer.view())
    const b = new Uint8Array(buffer.view())
    a[100] = 42
    expect(b[100]).toBe(42)
    buffer.release()
  })

  it('keeps the memory alive for its views after release(); the handle is then closed', () => {
    const buffer = new native.NativeBuffer(8192)
    const view = new Uint8Array(buffer.view())
    view[0] = 1
    buffer.release()
    buffer.release() // idempotent
    view[8191] = 2
    expect(view[0]).toBe(1)
    expect(view[8191]).toBe(2)
    view.fill(0x5a)
    expect(view.every((b) => b === 0x5a)).toBe(true)
    for (const get of [() => buffer.view(), () => buffer.address, () => buffer.size]) {
      const e = thrown(get)
      expect(e.code).toBe('ERR_CLOSED')
      expect(e.message).toBe('NativeBuffer is released')
    }
  })

  // A released NativeBuffer given to MemoryRegion needs a real PD (checked first): test/rdma/10.

  it('survives garbage collection of the handle while a view is alive', async () => {
    setFlagsFromString('--expose-gc')
    const gc = runInNewContext('gc') as () => void
    let view: Uint8Array
    {
      const buffer = new native.NativeBuffer(1 << 20)
      view = new Uint8Array(buffer.view())
      buffer.release()
    }
    view.fill(7)
    for (let i = 0; i < 5; i++) {
      gc()
      await new Promise((resolve) => setImmediate(resolve))
    }
    // Churn the allocator so freed memory would likely be reused.
    const others = Array.from({ length: 8 }, () => new native.NativeBuffer(1 << 20))
    for (const o of others) new Uint8Array(o.view()).fill(9)
    expect(view.every((b) => b === 7)).toBe(true)
    for (const o of others) o.release()
  })
})
