// Memory windows: a revocable remote grant over part of a region. Bind with
// qp.bindWindow(); revoke with qp.invalidate(rkey) (type 2), a rebind, or close().
import { native, type NativeMemoryWindow } from './native.js'
import { call } from './errors.js'
import { Resource } from './resource.js'
import type { ProtectionDomain } from './protection-domain.js'

export class MemoryWindow extends Resource {
  protected readonly kind = 'MemoryWindow'
  /** @internal */ readonly handle: NativeMemoryWindow
  readonly pd: ProtectionDomain
  readonly type: 1 | 2
  /** @internal rkey of the latest successful bind */
  boundRkey = 0
  /** @internal A bind of this window is in flight (the next needs its outcome). */
  binding = false

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
  }

  /** The rkey that the latest successful bind granted. */
  get rkey(): number { return this.boundRkey || this.handle.rkey }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}
