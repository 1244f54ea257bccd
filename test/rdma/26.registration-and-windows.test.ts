// Registered JS buffers that could move or shrink under the device, and the
// rkeys of rebound type 2 memory windows.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { MessageChannel } from 'node:worker_threads'
import { Access, RemoteRegion, type Device } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, pattern, testDevice } from './helpers.js'

let device: Device
const cleanups: Array<() => void> = []
beforeAll(() => { device = testDevice() })
afterEach(() => { for (const c of cleanups.splice(0)) c() })
afterAll(() => device?.close())

async function pair(access = ALL_ACCESS) {
  const p = await connectedPair(device, { access })
  cleanups.push(p.close)
  return p
}

/** A transfer of `buffer` either throws or leaves it attached (Node 20 copies a marked buffer). */
function tryTransfer(transfer: () => void): void {
  try {
    transfer()
  } catch (error) {
    expect((error as Error).name).toBe('DataCloneError')
  }
}

describe('registering JS buffers', () => {
  it('refuses resizable ArrayBuffers and growable SharedArrayBuffers with ERR_RESIZABLE', async () => {
    const { a } = await pair()
    const resizable = new ArrayBuffer(4096, { maxByteLength: 8192 })
    const growable = new SharedArrayBuffer(4096, { maxByteLength: 8192 })
    for (const memory of [resizable, new Uint8Array(resizable, 0, 4096), growable, new Uint8Array(growable)]) {
      // @ts-expect-error a SharedArrayBuffer (or a view over one) is not RegisterableMemory: on purpose, the run-time check must refuse a growable one too
      expect(() => a.pd.registerMemory(memory, Access.LocalWrite)).toThrow(expect.objectContaining({ code: 'ERR_RESIZABLE' }))
    }
    resizable.resize(16) // still the caller's: nothing was registered
    expect(resizable.byteLength).toBe(16)
  })

  it('refuses a SharedArrayBuffer and views over one with ERR_INVALID_ARG_TYPE, as the types do', async () => {
    const { a } = await pair()
    const shared = new SharedArrayBuffer(4096)
    const refused = (register: () => unknown) => expect(register).toThrow(expect.objectContaining({ name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' }))
    // @ts-expect-error a view over a SharedArrayBuffer is not RegisterableMemory
    refused(() => a.pd.registerMemory(new Uint8Array(shared), Access.LocalWrite))
    // @ts-expect-error nor is a DataView over one
    refused(() => a.pd.registerMemory(new DataView(shared, 64), Access.LocalWrite))
    // @ts-expect-error nor a Buffer over one
    refused(() => a.pd.registerMemory(Buffer.from(shared, 0, 64), Access.LocalWrite))
    // @ts-expect-error nor a bare SharedArrayBuffer
    refused(() => a.pd.registerMemory(shared, Access.LocalWrite))
  })

  it('a registered ArrayBuffer cannot be transferred away: the device keeps writing memory the caller still holds', async () => {
    const { a, b } = await pair()
    const buffer = new ArrayBuffer(8192)
    const region = b.pd.registerMemory(buffer, ALL_ACCESS)
    cleanups.unshift(() => region.close())
    tryTransfer(() => structuredClone(buffer, { transfer: [buffer] }))
    const { port1, port2 } = new MessageChannel()
    try {
      tryTransfer(() => port1.postMessage(buffer, [buffer]))
    } finally {
      port1.close()
      port2.close()
    }
    expect(buffer.byteLength).toBe(8192) // not detached
    a.region.bytes.set(pattern(4096, 26))
    await a.qp.write(a.region.slice(0, 4096), region.asRemote().slice(4096, 4096), { timeoutMs: 60_000 })
    expect(Buffer.compare(new Uint8Array(buffer, 4096, 4096), pattern(4096, 26))).toBe(0)
  })
})

describe('type 2 memory windows', () => {
  it('a rebind gives a new rkey; the old one is refused by the peer (REM_ACCESS_ERR)', async () => {
    const { a, b } = await pair(ALL_ACCESS | Access.MwBind)
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const first = await b.qp.bindWindow(window, b.region.slice(4096, 4096), Access.RemoteWrite, { timeoutMs: 60_000 })
    expect(window.rkey).toBe(first.rkey)
    a.region.bytes.set(pattern(64, 1), 0)
    await a.qp.write(a.region.slice(0, 64), new RemoteRegion(BigInt(first.addr), first.rkey, first.length).slice(0, 64), { timeoutMs: 60_000 })
    expect(Buffer.compare(b.region.bytes.subarray(4096, 4160), pattern(64, 1))).toBe(0)

    await b.qp.invalidate(first.rkey, { timeoutMs: 60_000 }) // a type 2 window is rebound from the free state
    const second = await b.qp.bindWindow(window, b.region.slice(8192, 4096), Access.RemoteWrite, { timeoutMs: 60_000 })
    expect(second.rkey).not.toBe(first.rkey)
    expect(window.rkey).toBe(second.rkey)
    a.region.bytes.set(pattern(64, 2), 64)
    await a.qp.write(a.region.slice(64, 64), new RemoteRegion(BigInt(second.addr), second.rkey, second.length).slice(0, 64), { timeoutMs: 60_000 })
    expect(Buffer.compare(b.region.bytes.subarray(8192, 8256), pattern(64, 2))).toBe(0)

    // A third bind: the rkey keeps moving on from the last one that took.
    await b.qp.invalidate(second.rkey, { timeoutMs: 60_000 })
    const third = await b.qp.bindWindow(window, b.region.slice(8192, 4096), Access.RemoteWrite, { timeoutMs: 60_000 })
    expect(new Set([first.rkey, second.rkey, third.rkey]).size).toBe(3)

    const stale = new RemoteRegion(BigInt(first.addr), first.rkey, first.length)
    await expect(a.qp.write(a.region.slice(128, 64), stale.slice(64, 64), { timeoutMs: 60_000 })).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
    expect(b.region.bytes[4096 + 64]).toBe(0)
  })

  // Linux 6.1's Soft-RoCE dereferences NULL in the kernel for a LOCAL_INV of
  // an unbound type 2 window (rxe_do_invalidate_mw): before this refusal the
  // fuzz test reset the guest (scripts/diag/invalidate-free-window.mjs).
  it('invalidating a window that is not bound (never bound, or already invalidated) is refused with ERR_WINDOW_NOT_BOUND; the QP lives on', async () => {
    const { a, b } = await pair(ALL_ACCESS | Access.MwBind)
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const bounded = { timeoutMs: 60_000 }
    await expect(b.qp.invalidate(window.rkey, bounded)).rejects.toMatchObject({ name: 'RdmaError', code: 'ERR_WINDOW_NOT_BOUND', verb: 'invalidate' })
    const grant = await b.qp.bindWindow(window, b.region.slice(4096, 4096), Access.RemoteWrite, bounded)
    await b.qp.invalidate(grant.rkey, bounded)
    await expect(b.qp.invalidate(grant.rkey, bounded)).rejects.toMatchObject({ code: 'ERR_WINDOW_NOT_BOUND' })
    // Nothing reached the device: the QP still works, and the window binds again.
    expect(b.qp.state).toBe('RTS')
    const last = await b.qp.bindWindow(window, b.region.slice(8192, 4096), Access.RemoteWrite, bounded)
    a.region.bytes.set(pattern(64, 3), 0)
    await a.qp.write(a.region.slice(0, 64), new RemoteRegion(BigInt(last.addr), last.rkey, last.length).slice(0, 64), bounded)
    expect(Buffer.compare(b.region.bytes.subarray(8192, 8256), pattern(64, 3))).toBe(0)
  })

  // The fuzz test reset the guest this way (seed 567953476): a second Device object on the same
  // kernel device allocated a type 2 window, and a QP of the first posted LOCAL_INV of its rkey,
  // which the first Device did not know. The kernel's rkey space is the device's, not the context's.
  it('an rkey no window of this process names, or one of a window opened through another Device object: refused before anything is posted', async () => {
    const { b } = await pair(ALL_ACCESS | Access.MwBind)
    const bounded = { timeoutMs: 60_000 }
    const other = testDevice()
    cleanups.unshift(() => other.close())
    const foreign = other.allocPd().allocMemoryWindow(2) // unbound: a LOCAL_INV of it would crash rxe 6.1's kernel
    await expect(b.qp.invalidate(foreign.rkey, bounded)).rejects.toMatchObject({ code: 'ERR_WINDOW_NOT_BOUND', verb: 'invalidate' })
    const unknown = (foreign.rkey + 0x100) >>> 0 // the next window index: nothing of ours
    await expect(b.qp.invalidate(unknown, bounded)).rejects.toMatchObject({ code: 'ERR_WINDOW_NOT_BOUND' })
    // Nothing reached the device: the QP still works, and a window of its own binds and is invalidated.
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const grant = await b.qp.bindWindow(window, b.region.slice(4096, 4096), Access.RemoteWrite, bounded)
    await b.qp.invalidate(grant.rkey, bounded)
    expect(b.qp.state).toBe('RTS')
  })

  it('invalidate() while a bind of the window is in flight: refused with ERR_BUSY, and the bind still completes', async () => {
    // One send slot, held by a SEND the peer has no receive for (RNR: retried until one is posted), so
    // the bind waits for it. On rxe a bind posted at once completes inside its post call, so "in
    // flight" is seen only while it waits.
    const p = await connectedPair(device, { access: ALL_ACCESS | Access.MwBind, qp: { maxSendWr: 1 } })
    cleanups.push(p.close)
    const { a, b } = p
    const bounded = { timeoutMs: 60_000 }
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const sending = b.qp.send(b.region.slice(0, 8), bounded)
    const binding = b.qp.bindWindow(window, b.region.slice(0, 4096), Access.RemoteWrite, bounded)
    // The library cannot know what the device will hold once the bind is done: a LOCAL_INV now could
    // leave it counting a window bound that the device holds unbound (the next LOCAL_INV would then
    // crash rxe 6.1's kernel).
    await expect(b.qp.invalidate(window.rkey, bounded)).rejects.toMatchObject({ code: 'ERR_BUSY', verb: 'invalidate' })
    const received = a.qp.recv(a.region.slice(0, 64), bounded)
    await sending
    await received
    const grant = await binding
    await b.qp.invalidate(grant.rkey, bounded) // once bound, the window is invalidated as usual
    expect(b.qp.state).toBe('RTS')
  })

  it('a failed bind reports no rkey: the window keeps the one it had', async () => {
    const { b } = await pair() // the region lacks Access.MwBind: the device refuses the bind
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const before = window.rkey
    await expect(b.qp.bindWindow(window, b.region.slice(0, 4096), Access.RemoteWrite, { timeoutMs: 60_000 })).rejects.toMatchObject({ code: expect.any(String) })
    expect(window.rkey).toBe(before)
  })
})
