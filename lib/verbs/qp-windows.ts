// Memory windows through a QP: binding a window over part of a region
// (BIND_MW) and invalidating a type 2 window's rkey (LOCAL_INV).
import { RdmaError } from '../core/errors.js'
import { SendFlags, WrOpcode } from '../core/constants.js'
import { instance, integer, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { MemoryWindow, windowState } from './memory-window.js'
import { LocalSlice } from './memory.js'
import type { QpContext } from './work-requests.js'

/**
 * Binds a memory window over part of a region (the region needs
 * Access.MwBind) and resolves with a descriptor of the window for the peer.
 */
export function bindWindow(qp: QpContext, window: MemoryWindow, slice: LocalSlice, access: number, options: WaitOptions = {}): Promise<{ version: 1; addr: string; rkey: number; length: number }> {
  return new Promise((resolve, reject) => {
    try {
      instance(window, 'window', MemoryWindow)
      if (!(slice instanceof LocalSlice)) throw typeError('a LocalSlice', 'slice', slice)
      slice.region.assertUsable()
      integer(access, 'access', 0, 0xffffffff)
      const wait = waitOptions(options)
      if (qp.type === 'UD') throw new RdmaError('bindWindow needs a connected QP (RC or UC)', { code: 'ERR_QP_TYPE' })
      if (windowState(window).binding) throw new RdmaError('A bind of this memory window is in flight: wait for it before binding again', { code: 'ERR_BUSY' })
      // The device takes the new rkey only if the bind completes: until then
      // the window keeps the rkey it had (type 1 binds change it at post).
      const before = window.handle.rkey
      windowState(window).binding = true
      try {
        bindSubmit(qp, window, before, slice, access, wait, resolve, reject)
      } catch (error) {
        windowState(window).binding = false
        throw error
      }
    } catch (error) {
      reject(error)
    }
  })
}

/** Posts the bind; the window's rkey changes only when it completes. */
export function bindSubmit(qp: QpContext, window: MemoryWindow, before: number, slice: LocalSlice, access: number, wait: WaitOptions,
  resolve: (value: { version: 1; addr: string; rkey: number; length: number }) => void, reject: (error: Error) => void): void {
  let rkey = 0
  qp.queues.submit('send', 'bindWindow', 1, [slice.region], wait, resolve,
    (error) => {
      windowState(window).binding = false
      if (!window.closed) window.handle.setRkey(before)
      reject(error)
    },
    () => {
      windowState(window).binding = false
      if (!window.closed) window.handle.setRkey(rkey)
      windowState(window).boundRkey = rkey
      windowState(window).bound = true
      return { version: 1 as const, addr: '0x' + slice.address.toString(16), rkey, length: slice.length }
    },
    (first) => {
      rkey = qp.handle.bindMemoryWindow(window.handle, slice.region.handle, slice.address, slice.length, access, first >>> 0, Math.floor(first / 4294967296), SendFlags.Signaled)
    }, true)
}

/**
 * The type 2 window that `rkey` names (this process's, on this kernel
 * device), marked unbound from this post on (a second invalidation is
 * refused); refused if there is none, if a bind of it is in flight, or if
 * it is not bound now. Soft-RoCE on Linux 6.1 dereferences NULL in the
 * kernel for a LOCAL_INV of an unbound type 2 window, and the spec makes it
 * an error. (A type 1 window's rkey is posted: the device refuses it.)
 */
export function windowToInvalidate(qp: QpContext, rkey: number): MemoryWindow | undefined {
  const window = qp.pd.device.windowWithRkey(rkey)
  // An rkey of no window this process knows may still name an unbound window (of another
  // process, or closed here but not yet freed): refused, as the kernel would crash on it.
  if (window === undefined) {
    throw new RdmaError(`Cannot invalidate rkey ${rkey}: it names no memory window of this process on this device`, {
      code: 'ERR_WINDOW_NOT_BOUND', verb: 'invalidate', qpn: qp.qpn,
    })
  }
  if (window.type !== 2) return undefined // the device refuses it with a completion error
  // While a bind is in flight the library cannot know what the device will hold: a LOCAL_INV
  // then could unbind a window it still counts as bound, and the next one would crash the kernel.
  if (windowState(window).binding) {
    throw new RdmaError(`Cannot invalidate rkey ${rkey}: a bind of its memory window is in flight; wait for it first`, {
      code: 'ERR_BUSY', verb: 'invalidate', qpn: qp.qpn,
    })
  }
  if (!windowState(window).bound) {
    throw new RdmaError(`Cannot invalidate rkey ${rkey}: its memory window is not bound (never bound, or already invalidated)`, {
      code: 'ERR_WINDOW_NOT_BOUND', verb: 'invalidate', qpn: qp.qpn,
    })
  }
  windowState(window).bound = false
  return window
}

/** LOCAL_INV: invalidates a type 2 memory window's rkey on this device. */
export function invalidate(qp: QpContext, rkey: number, options: WaitOptions = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    try {
      integer(rkey, 'rkey', 0, 0xffffffff)
      if (qp.type === 'UD') throw new RdmaError('invalidate needs a connected QP (RC or UC)', { code: 'ERR_QP_TYPE' })
      const wait = waitOptions(options)
      const window = windowToInvalidate(qp, rkey)
      qp.queues.submit('send', 'invalidate', 1, [], wait, () => resolve(), (error) => {
        if (window !== undefined && !window.closed) windowState(window).bound = true // refused: the window keeps its bind
        reject(error)
      }, () => undefined, (first, enc) => {
        enc.addSend({ wrId: first, opcode: WrOpcode.LocalInv, flags: SendFlags.Signaled, sges: [], immOrRkey: rkey })
      })
    } catch (error) {
      reject(error)
    }
  })
}
