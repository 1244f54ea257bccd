// Protection domain: the owner of memory registrations, queue pairs, SRQs,
// address handles and memory windows.
import { native, type NativeProtectionDomain } from '../native/addon.js'
import { call, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { Access } from '../core/constants.js'
import { integer } from '../core/validate.js'
import { MemoryRegion, NativeMemory, type RegisterableMemory } from './memory.js'
import { QueuePair } from './queue-pair.js'
import type { QueuePairOptions } from './queue-pair-options.js'
import { SharedReceiveQueue, type SharedReceiveQueueOptions } from './shared-receive-queue.js'
import { AddressHandle, type AddressHandleOptions } from './address-handle.js'
import { MemoryWindow } from './memory-window.js'
import { dmabufRange } from './dmabuf.js'
import type { Device } from './device.js'

export class ProtectionDomain extends Resource {
  protected readonly kind = 'ProtectionDomain'
  /** @internal */ readonly handle: NativeProtectionDomain
  readonly device: Device

  /** Not constructible: made by device.allocPd(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(device: Device)
  constructor(device: Device) {
    super()
    this.device = device
    this.handle = call(() => new native.ProtectionDomain(device.handle))
    this.adoptedBy(device)
  }

  /** Page-aligned, zero-filled memory owned by the library. */
  allocBuffer(size: number): NativeMemory {
    this.assertOpen()
    return new NativeMemory(size)
  }

  /**
   * Registers memory for RDMA with the given Access flags: library memory
   * from allocBuffer(), or a JS ArrayBuffer / Buffer / typed array (zero copy).
   */
  registerMemory(memory: RegisterableMemory, access: number = Access.LocalWrite): MemoryRegion {
    this.assertOpen()
    integer(access, 'access', 0, 0x7fffffff)
    if ((access & (Access.RemoteWrite | Access.RemoteAtomic)) && !(access & Access.LocalWrite)) {
      throw new RdmaError('ibv_reg_mr: RemoteWrite and RemoteAtomic access need LocalWrite too', { code: 'EINVAL', errno: 22, syscall: 'ibv_reg_mr' })
    }
    return new MemoryRegion(this, memory, access)
  }

  /**
   * Registers `length` bytes from `offset` of a dma-buf (its fd, e.g. GPU
   * memory exported by CUDA or ROCm) with ibv_reg_dmabuf_mr. The region has
   * no `bytes`; its `address` is `iova` (default: `offset`), which must have
   * the page offset of `offset`. EOPNOTSUPP when the device, its kernel
   * driver or the installed rdma-core (< 34) cannot.
   */
  registerDmabuf(fd: number, offset: number, length: number, access: number, iova?: number): MemoryRegion {
    this.assertOpen()
    const range = dmabufRange(fd, offset, length, access, iova)
    return new MemoryRegion(this, range, access)
  }

  /** allocBuffer(size) registered with `access`, in one call. */
  allocRegion(size: number, access: number = Access.LocalWrite): MemoryRegion {
    return this.registerMemory(this.allocBuffer(size), access)
  }

  createQp(options: QueuePairOptions): QueuePair {
    this.assertOpen()
    return new QueuePair(this, options)
  }

  createSrq(options: SharedReceiveQueueOptions = {}): SharedReceiveQueue {
    this.assertOpen()
    return new SharedReceiveQueue(this, options)
  }

  createAddressHandle(options: AddressHandleOptions): AddressHandle {
    this.assertOpen()
    return new AddressHandle(this, options)
  }

  allocMemoryWindow(type: 1 | 2 = 2): MemoryWindow {
    this.assertOpen()
    integer(type, 'type', 1, 2)
    return new MemoryWindow(this, type as 1 | 2)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}
