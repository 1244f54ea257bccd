// Memory windows: a revocable remote grant over part of a region. Bind with
// qp.bindWindow(); revoke with qp.invalidate(rkey) (type 2), a rebind, or close().
import { native, type NativeMemoryWindow } from '../native/addon.js'
import { call } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import type { ProtectionDomain } from './protection-domain.js'

/**
 * What the library knows of a window's binds (qp-windows.ts keeps it). Not
 * reachable from user code: setting `bound` on an unbound type 2 window would
 * let an invalidation through that crashes Linux 6.1's Soft-RoCE.
 */
export interface WindowState {
  /** The rkey of the latest successful bind. */
  boundRkey: number
  /** A bind of this window is in flight (the next needs its outcome). */
  binding: boolean
  /**
   * Type 2: a bind completed and no invalidation (local, posted; or remote,
   * received) has revoked it since. Invalidating a type 2 window that is not
   * bound is an error, and Linux 6.1's Soft-RoCE dereferences NULL in the
   * kernel for it (rxe_do_invalidate_mw): the library refuses it first.
   */
  bound: boolean
}

let stateOf: (window: MemoryWindow) => WindowState

/** The bind state of `window` (this module's function is not on the package entry). */
export function windowState(window: MemoryWindow): WindowState {
  return stateOf(window)
}

/** A SEND_WITH_INV received here revoked the bind of the window `rkey` names (if it is one of this process's on the device). */
export function windowRevoked(device: { windowWithRkey(rkey: number): MemoryWindow | undefined }, rkey: number): void {
  const window = device.windowWithRkey(rkey)
  if (window !== undefined) stateOf(window).bound = false
}

export class MemoryWindow extends Resource {
  protected readonly kind = 'MemoryWindow'
  /** @internal */ readonly handle: NativeMemoryWindow
  readonly pd: ProtectionDomain
  readonly type: 1 | 2
  readonly #state: WindowState = { boundRkey: 0, binding: false, bound: false }
  static {
    stateOf = (window) => window.#state
  }
  readonly #ref = new WeakRef<MemoryWindow>(this)

  /** Not constructible: made by pd.allocMemoryWindow(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(pd: ProtectionDomain, type: 1 | 2)
  constructor(pd: ProtectionDomain, type: 1 | 2) {
    super()
    this.pd = pd
    this.type = type
    this.handle = call(() => new native.MemoryWindow(pd.handle, type))
    this.adoptedBy(pd)
    pd.device.trackWindow(this.#ref)
  }

  /** The rkey that the latest successful bind granted. */
  get rkey(): number { return this.#state.boundRkey || this.handle.rkey }

  protected override afterClose(): void {
    this.pd.device.untrackWindow(this.#ref)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}
