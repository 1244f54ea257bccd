// A region as the request bookkeeping (lib/ops/) sees it, counting holds:
// for unit tests of rings and Pending without a device.
import { INFLIGHT, RELEASE, type HeldRegion } from '../../lib/ops/held-region.js'

export interface FakeRegion extends HeldRegion { readonly inflight: number; length: number; bytes: Uint8Array }

export function fakeRegion(length = 64): FakeRegion {
  return {
    [INFLIGHT]: 0,
    get inflight() { return this[INFLIGHT] },
    length,
    bytes: new Uint8Array(length),
    [RELEASE]() { this[INFLIGHT]-- },
  }
}
