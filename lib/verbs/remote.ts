// Memory on a peer: a region known from its descriptor, and bounds-checked
// slices of it. The peer's NIC enforces the rkey; these checks keep what this
// API posts inside what the peer described.
import { integer, object, rangeError, sliceBounds, typeError, uint64 } from '../core/validate.js'

const TWO_32 = 4294967296
const TWO_64 = 1n << 64n

/** Remote memory descriptor, version 1. `addr` is a hex string so that 64-bit addresses survive JSON. */
export interface RemoteDescriptor { version: 1; addr: string; rkey: number; length: number }

/** Memory on a peer, known from its descriptor. */
export class RemoteRegion {
  readonly addr: bigint
  readonly rkey: number
  readonly length: number
  /** @internal The address's high and low 32 bits, for the encoder. */
  readonly addrHi: number
  /** @internal */ readonly addrLo: number

  /** Checked: `addr` a bigint, `rkey` 32 bits, `length` a byte count, ending at or below 2^64. */
  constructor(addr: bigint, rkey: number, length: number) {
    uint64(addr, 'addr')
    integer(rkey, 'rkey', 0, 0xffffffff)
    integer(length, 'length', 0, Number.MAX_SAFE_INTEGER)
    if (addr + BigInt(length) > TWO_64) throw rangeError('a region that ends at or below 2^64', 'length', length)
    this.addr = addr
    this.rkey = rkey
    this.length = length
    this.addrHi = Number(addr >> 32n)
    this.addrLo = Number(addr & 0xffffffffn)
  }

  slice(offset = 0, length?: number): RemoteSlice {
    return new RemoteSlice(this, offset, length === undefined && typeof offset === 'number' ? this.length - offset : length as number)
  }

  describe(): RemoteDescriptor {
    return { version: 1, addr: '0x' + this.addr.toString(16), rkey: this.rkey, length: this.length }
  }
}

/** A bounds-checked part of a remote region. */
export class RemoteSlice {
  readonly region: RemoteRegion
  readonly offset: number
  readonly length: number
  /** @internal */ readonly addrHi: number
  /** @internal */ readonly addrLo: number

  /** Checked: `region` a RemoteRegion, [offset, offset + length) inside it (ERR_OUT_OF_RANGE otherwise). */
  constructor(region: RemoteRegion, offset: number, length: number) {
    if (!(region instanceof RemoteRegion)) throw typeError('a RemoteRegion', 'region', region)
    sliceBounds(offset, length, region.length)
    this.region = region
    this.offset = offset
    this.length = length
    const lo = region.addrLo + offset
    this.addrLo = lo % TWO_32
    this.addrHi = (region.addrHi + Math.floor(lo / TWO_32)) >>> 0
  }

  get rkey(): number { return this.region.rkey }
  get addr(): bigint { return (BigInt(this.addrHi) << 32n) | BigInt(this.addrLo) }
}

/** Turns a descriptor (from describe(), possibly via JSON) into a RemoteRegion. */
export function remoteRegion(descriptor: unknown): RemoteRegion {
  const d = object(descriptor, 'descriptor')
  if (d.version !== 1) throw typeError('version 1', 'descriptor.version', d.version)
  if (typeof d.addr !== 'string' || !/^0x[0-9a-f]{1,16}$/i.test(d.addr)) throw typeError('a hex address string', 'descriptor.addr', d.addr)
  const rkey = integer(d.rkey, 'descriptor.rkey', 0, 0xffffffff)
  const length = integer(d.length, 'descriptor.length', 0, Number.MAX_SAFE_INTEGER)
  const addr = BigInt(d.addr)
  if (addr + BigInt(length) > TWO_64) throw rangeError('a region that ends below 2^64', 'descriptor.length', length)
  return new RemoteRegion(addr, rkey, length)
}
