// Protection domain: the owner of memory registrations, queue pairs, SRQs,
// address handles and memory windows.
import { native, type NativeProtectionDomain } from '../native/addon.js'
import { call, RdmaError } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { Access } from '../core/constants.js'
import { integer } from '../core/validate.js'
import { MemoryRegion, NativeMemory, type LocalSlice, type RegisterableMemory } from './memory.js'
import { QueuePair } from './queue-pair.js'
import type { QueuePairOptions } from './queue-pair-options.js'
import { SharedReceiveQueue, type SharedReceiveQueueOptions } from './shared-receive-queue.js'
import { AddressHandle, type AddressHandleOptions } from './address-handle.js'
import { MemoryWindow } from './memory-window.js'
import type { Device } from './device.js'

const SLOT = 8
const SLOTS_PER_PAGE = 512

/** 8-byte slots of library-owned memory where atomics' old values land: take one, give it back once the device is done. */
export interface AtomicSlotPool {
  take(): LocalSlice
  give(slice: LocalSlice): void
}

let slotsOf: (pd: ProtectionDomain) => AtomicSlotPool

/** The atomic slots of `pd` (for its queue pairs: this module's function is not on the package entry, so user code cannot take or give slots). */
export function atomicSlotsOf(pd: ProtectionDomain): AtomicSlotPool {
  return slotsOf(pd)
}

export class ProtectionDomain extends Resource {
  protected readonly kind = 'ProtectionDomain'
  /** @internal */ readonly handle: NativeProtectionDomain
  readonly device: Device
  #freeSlots: LocalSlice[] = []

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

  static {
    // The PD's library-owned atomic result slots, for its QPs only (atomicSlotsOf(); not on the package entry).
    slotsOf = (pd) => ({
      take: () => {
        if (pd.#freeSlots.length === 0) {
          // The free slots (and the requests using the others) keep the region alive.
          const region = pd.allocRegion(SLOT * SLOTS_PER_PAGE, Access.LocalWrite)
          for (let i = 0; i < SLOTS_PER_PAGE; i++) pd.#freeSlots.push(region.slice(i * SLOT, SLOT))
        }
        return pd.#freeSlots.pop()!
      },
      give: (slice) => { pd.#freeSlots.push(slice) },
    })
  }

  protected override afterClose(): void {
    this.#freeSlots = []
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}
