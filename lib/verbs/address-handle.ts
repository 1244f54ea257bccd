// Address handles: the destination of UD sends.
import { native, type NativeAddressHandle } from '../native/addon.js'
import { call } from '../core/errors.js'
import { Resource } from '../core/resource.js'
import { integer, object, typeError } from '../core/validate.js'
import type { ProtectionDomain } from './protection-domain.js'

export interface AddressHandleOptions {
  /** Destination GID (IPv6 form, e.g. '::ffff:198.18.0.1'); required on RoCE. */
  gid?: string
  lid?: number
  /** Source GID index (default: the port's default GID). */
  sgidIndex?: number
  port?: number
  sl?: number
  hopLimit?: number
  trafficClass?: number
  flowLabel?: number
}

export class AddressHandle extends Resource {
  protected readonly kind = 'AddressHandle'
  /** @internal */ readonly handle: NativeAddressHandle
  /** @internal */ readonly id: number
  readonly pd: ProtectionDomain

  /** Not constructible: made by pd.createAddressHandle(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(pd: ProtectionDomain, options: AddressHandleOptions)
  constructor(pd: ProtectionDomain, options: AddressHandleOptions) {
    super()
    const o = object(options, 'options')
    const port = integer(o.port ?? 1, 'options.port', 1, 255)
    const attr: Record<string, unknown> = {
      dlid: integer(o.lid ?? 0, 'options.lid', 0, 0xffff),
      sl: integer(o.sl ?? 0, 'options.sl', 0, 15),
      portNum: port,
    }
    if (o.gid !== undefined) {
      if (typeof o.gid !== 'string') throw typeError('a GID string', 'options.gid', o.gid)
      attr.grh = {
        dgid: o.gid,
        sgidIndex: integer(o.sgidIndex ?? pd.device.defaultGidIndex(port), 'options.sgidIndex', 0, 255),
        hopLimit: integer(o.hopLimit ?? 64, 'options.hopLimit', 0, 255),
        trafficClass: integer(o.trafficClass ?? 0, 'options.trafficClass', 0, 255),
        flowLabel: integer(o.flowLabel ?? 0, 'options.flowLabel', 0, 0xfffff),
      }
    }
    this.pd = pd
    this.handle = call(() => new native.AddressHandle(pd.handle, attr))
    this.id = this.handle.id
    this.adoptedBy(pd)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}
