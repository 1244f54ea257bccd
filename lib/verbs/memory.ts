// Native buffers, memory regions, and the local/remote slices that work
// requests name. Every slice is bounds-checked when it is made (remote
// memory: remote.ts).
import { native, type NativeBufferHandle, type NativeMemoryRegion } from '../native/addon.js'
import { call, closedError, RdmaError } from '../core/errors.js'
import { explainRegistrationFailure } from '../core/memlock.js'
import { Resource } from '../core/resource.js'
import { integer, rangeError, sliceBounds, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { readU64LE } from '../core/u64.js'
import { INFLIGHT, RELEASE } from '../ops/held-region.js'
import type { ProtectionDomain } from './protection-domain.js'
import { remoteRegion, type RemoteDescriptor, type RemoteRegion } from './remote.js'
import { DmabufRange, registerDmabufHandle } from './dmabuf.js'
import { markAsUntransferable } from 'node:worker_threads'

/** The most bytes one view (Uint8Array) of native memory holds: larger memory is seen through windows. */
const MAX_VIEW_BYTES = 4294967296

/** Page-aligned memory owned by the library (not a JS ArrayBuffer, so it can't be detached). */
export class NativeMemory {
  /** The most bytes one view (`bytes`, `window()`) holds: 4 GiB. Larger memory is seen through windows. */
  static readonly MAX_VIEW_BYTES = MAX_VIEW_BYTES
  /** @internal */ readonly handle: NativeBufferHandle
  readonly size: number
  #bytes: Uint8Array<ArrayBuffer> | undefined

  constructor(size: number) {
    integer(size, 'size', 1, Number.MAX_SAFE_INTEGER)
    this.handle = call(() => new native.NativeBuffer(size))
    this.size = size
  }

  /**
   * A view of the whole memory; the memory stays alive while this view does.
   * Throws ERR_VIEW_TOO_LARGE for memory over MAX_VIEW_BYTES: use window().
   */
  get bytes(): Uint8Array<ArrayBuffer> {
    return this.#bytes ??= this.window(0, this.size)
  }

  /** A view of `length` bytes from `offset` (at most MAX_VIEW_BYTES); it keeps the memory alive. */
  window(offset: number, length: number): Uint8Array<ArrayBuffer> {
    integer(offset, 'offset', 0, this.size)
    integer(length, 'length', 0, this.size - offset)
    if (length > MAX_VIEW_BYTES) throw viewTooLarge(length)
    return new Uint8Array(call(() => this.handle.view(offset, length)))
  }

  get address(): number { return this.handle.address }
}

/** ibv_reg_mr through `create`; a refusal by RLIMIT_MEMLOCK says so (ERR_MEMLOCK_LIMIT). */
function register(create: () => NativeMemoryRegion, length: number): NativeMemoryRegion {
  try {
    return call(create)
  } catch (error) {
    throw explainRegistrationFailure(error, length)
  }
}

function viewTooLarge(length: number): RdmaError {
  return new RdmaError(`A view holds at most ${MAX_VIEW_BYTES} bytes (4 GiB), not ${length}: view a window instead (region.slice(offset, length).bytes)`, { code: 'ERR_VIEW_TOO_LARGE' })
}

function noBytes(): RdmaError {
  return new RdmaError('A dma-buf region has no bytes view: its memory is the dma-buf exporter\'s (map it through the exporter, e.g. the GPU API)', { code: 'ERR_NO_BYTES' })
}

export type RegisterableMemory = NativeMemory | ArrayBuffer | ArrayBufferView<ArrayBuffer>

export class MemoryRegion extends Resource {
  protected readonly kind = 'MemoryRegion'
  protected override readonly closeLast = true
  /** @internal */ readonly handle: NativeMemoryRegion
  readonly pd: ProtectionDomain
  readonly access: number
  readonly address: number
  readonly length: number
  readonly lkey: number
  readonly rkey: number
  /** Whether this is dma-buf memory (pd.registerDmabuf): no bytes view, never sent inline; `address` is its iova. */
  readonly dmabuf: boolean
  /** @internal The registered JS bytes; undefined for library memory (see `bytes`). */
  readonly #jsBytes: Uint8Array<ArrayBuffer> | undefined
  /** @internal Work requests in flight that name this region (ops/held-region.ts): read `inflight`. */
  [INFLIGHT] = 0
  /** Whether close() has not run, for assertUsable() per operation (Resource's assertOpen() is a megamorphic access). */
  #open = true
  #idleWaiters: Array<() => void> = []
  readonly #jsBacking: ArrayBuffer | undefined
  readonly #memory: NativeMemory | undefined

  /** Not constructible: made by pd.registerMemory(), pd.allocRegion() or pd.registerDmabuf(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(pd: ProtectionDomain, memory: RegisterableMemory | DmabufRange, access: number)
  constructor(pd: ProtectionDomain, memory: RegisterableMemory | DmabufRange, access: number) {
    super()
    this.pd = pd
    this.access = access
    this.dmabuf = memory instanceof DmabufRange
    if (memory instanceof DmabufRange) {
      this.handle = registerDmabufHandle(pd, memory, access)
    } else if (memory instanceof NativeMemory) {
      this.handle = register(() => new native.MemoryRegion(pd.handle, memory.handle, access), memory.size)
      this.#memory = memory
    } else if (memory instanceof ArrayBuffer || ArrayBuffer.isView(memory) || isSharedArrayBuffer(memory)) {
      this.#jsBytes = registerableBytes(memory, 'memory')
      this.#jsBacking = this.#jsBytes.buffer
      this.handle = register(() => new native.MemoryRegion(pd.handle, memory, access), this.#jsBytes.byteLength)
      // A transfer (postMessage, structuredClone) would detach the buffer and
      // hand its memory to another owner while the device still writes it.
      // Marked, it is copied (Node 20) or refused (later Node) instead. The
      // mark is permanent: it stays after deregistration.
      markAsUntransferable(this.#jsBacking)
    } else {
      throw typeError('a NativeMemory, ArrayBuffer or ArrayBufferView', 'memory', memory)
    }
    const info = this.handle.info()
    this.address = info.address
    this.length = info.length
    this.lkey = info.lkey
    this.rkey = info.rkey
    this.adoptedBy(pd)
  }

  /**
   * The registered bytes (a view, no copy). Throws ERR_VIEW_TOO_LARGE for a
   * region over MAX_VIEW_BYTES: use slice(offset, length).bytes for a window.
   */
  get bytes(): Uint8Array<ArrayBuffer> {
    if (this.dmabuf) throw noBytes()
    return this.#jsBytes ?? this.#memory!.bytes
  }

  /** @internal A view of [offset, offset + length) of the registered bytes. */
  window(offset: number, length: number): Uint8Array<ArrayBuffer> {
    if (this.dmabuf) throw noBytes()
    if (this.#jsBytes !== undefined) return this.#jsBytes.subarray(offset, offset + length)
    if (this.length <= MAX_VIEW_BYTES) return this.#memory!.bytes.subarray(offset, offset + length)
    return this.#memory!.window(offset, length)
  }

  /** A part of this region for local use in a work request. */
  slice(offset = 0, length?: number): LocalSlice {
    this.assertOpen()
    return new LocalSlice(this, offset, length === undefined && typeof offset === 'number' ? this.length - offset : length as number)
  }

  /** A JSON-safe descriptor a peer turns into a RemoteRegion with remoteRegion(). */
  describe(): RemoteDescriptor {
    this.assertOpen()
    return { version: 1, addr: '0x' + this.address.toString(16), rkey: this.rkey, length: this.length }
  }

  /** This region as a remote target (for loopback use on the same device). */
  asRemote(): RemoteRegion {
    return remoteRegion(this.describe())
  }

  /** @internal Whether the region can be named in a new work request (assertUsable() says why not). */
  get usable(): boolean {
    return this.#open && !(this.#jsBacking !== undefined && this.#jsBacking.byteLength === 0)
  }

  /** @internal Throws unless the region can be named in a new work request. */
  assertUsable(): void {
    if (!this.#open) throw closedError(this.kind)
    if (this.#jsBacking !== undefined && this.#jsBacking.byteLength === 0) {
      throw new RdmaError('The registered ArrayBuffer was detached (transferred); register it again', { code: 'ERR_DETACHED' })
    }
  }

  /** Deregisters the region. Refused (ERR_BUSY) while work requests that name it are in flight. */
  deregister(): void {
    this.close()
  }

  /**
   * Deregisters the region once no work request names it any more. Rejects
   * with ETIMEDOUT or ABORT_ERR (leaving the region registered) if that does
   * not happen in time.
   */
  async deregisterWhenIdle(options: WaitOptions = {}): Promise<void> {
    const wait = waitOptions(options)
    if (this.inflight > 0) {
      await new Promise<void>((resolve, reject) => {
        let timer: NodeJS.Timeout | undefined
        const done = (error?: Error) => {
          this.#idleWaiters = this.#idleWaiters.filter((w) => w !== wake)
          if (timer) clearTimeout(timer)
          wait.signal?.removeEventListener('abort', onAbort)
          if (error) reject(error)
          else resolve()
        }
        const wake = () => done()
        const onAbort = () => done(new RdmaError('deregisterWhenIdle was aborted', { code: 'ABORT_ERR', cause: wait.signal?.reason }))
        if (wait.signal?.aborted) return onAbort()
        this.#idleWaiters.push(wake)
        wait.signal?.addEventListener('abort', onAbort, { once: true })
        if (wait.timeoutMs !== undefined) {
          timer = setTimeout(() => done(new RdmaError(`${this.inflight} work request(s) still name this region after ${wait.timeoutMs} ms`, { code: 'ETIMEDOUT' })), wait.timeoutMs)
        }
      })
    }
    this.close()
  }

  /** Work requests in flight that name this region. */
  get inflight(): number { return this[INFLIGHT] }

  /** @internal Request bookkeeping: the device is done with a work request that named this region. */
  [RELEASE](): void {
    if (--this[INFLIGHT] === 0 && this.#idleWaiters.length > 0) this.#wakeIdle()
  }

  #wakeIdle(): void {
    for (const wake of this.#idleWaiters.slice()) wake()
  }

  protected override afterClose(): void {
    this.#open = false
  }

  protected override onClose(): void {
    if (this.inflight > 0) {
      throw new RdmaError(`Cannot deregister: ${this.inflight} work request(s) naming this region are in flight`, { code: 'ERR_BUSY' })
    }
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
    void this.#memory
  }
}

/**
 * The bytes of JavaScript memory given to be registered, refused (before
 * anything is done with it) when it could not stay where it is for as long
 * as it is registered: resizable or growable (ERR_RESIZABLE), detached
 * (ERR_DETACHED), over a SharedArrayBuffer (ERR_INVALID_ARG_TYPE, as the
 * types say: the addon cannot read one), or empty. Both transports check
 * memory so (tcp: plain-memory.ts), so that the same memory is refused the
 * same way on either.
 */
export function registerableBytes(memory: ArrayBufferLike | ArrayBufferView, name: string): Uint8Array<ArrayBuffer> {
  // The device keeps the address and length it registered: memory that
  // can shrink or move under it must never be registered.
  if (isResizable(memory)) throw new RdmaError('Cannot register a resizable ArrayBuffer or growable SharedArrayBuffer: use a fixed-length ArrayBuffer or allocBuffer()', { code: 'ERR_RESIZABLE' })
  const buffer = ArrayBuffer.isView(memory) ? memory.buffer : memory
  if (!(buffer instanceof ArrayBuffer)) throw typeError(ArrayBuffer.isView(memory) ? 'an ArrayBuffer-backed view' : 'a NativeMemory, ArrayBuffer or ArrayBufferView', name, memory)
  if (isDetached(buffer)) throw new RdmaError('Cannot register a detached ArrayBuffer', { code: 'ERR_DETACHED' })
  const bytes = ArrayBuffer.isView(memory) ? new Uint8Array(buffer, memory.byteOffset, memory.byteLength) : new Uint8Array(buffer)
  if (bytes.byteLength === 0) throw rangeError('at least 1 byte', `${name}.byteLength`, 0)
  return bytes
}

/** A SharedArrayBuffer given where the types refuse one: checked at run time, to be refused with a code. */
export function isSharedArrayBuffer(memory: unknown): memory is SharedArrayBuffer {
  return typeof SharedArrayBuffer !== 'undefined' && memory instanceof SharedArrayBuffer
}

function isResizable(memory: unknown): boolean {
  const buffer = ArrayBuffer.isView(memory) ? memory.buffer : memory
  if (buffer instanceof ArrayBuffer) return (buffer as { resizable?: boolean }).resizable === true
  if (buffer instanceof SharedArrayBuffer) return (buffer as { growable?: boolean }).growable === true
  return false
}

function isDetached(buffer: ArrayBufferLike): boolean {
  if (buffer.byteLength !== 0) return false
  try {
    new Uint8Array(buffer)
    return false
  } catch {
    return true
  }
}

/** A bounds-checked part of a local memory region. */
export class LocalSlice {
  readonly region: MemoryRegion
  readonly offset: number
  readonly length: number

  /**
   * Checked: `region` a MemoryRegion, [offset, offset + length) inside it
   * (ERR_OUT_OF_RANGE otherwise). Work requests compute their addresses from
   * these fields, so no slice can name memory outside its region.
   */
  constructor(region: MemoryRegion, offset: number, length: number) {
    if (!(region instanceof MemoryRegion)) throw typeError('a MemoryRegion', 'region', region)
    sliceBounds(offset, length, region.length)
    this.region = region
    this.offset = offset
    this.length = length
  }

  get address(): number { return this.region.address + this.offset }
  get lkey(): number { return this.region.lkey }
  /** The bytes of this slice (a view, no copy); ERR_VIEW_TOO_LARGE over MAX_VIEW_BYTES. */
  get bytes(): Uint8Array<ArrayBuffer> { return this.region.window(this.offset, this.length) }
}

/** The 8 bytes an atomic wrote into `local`, as the value before the operation. */
export function readAtomicValue(local: LocalSlice): bigint {
  return local.region.length <= MAX_VIEW_BYTES ? readU64LE(local.region.bytes, local.offset) : readU64LE(local.bytes, 0)
}
