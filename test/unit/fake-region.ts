// A region as the request bookkeeping (lib/ops/) sees it, counting holds:
// for unit tests of rings and Pending without a device.
import { HOLD, RELEASE, type HeldRegion } from '../../lib/ops/held-region.js'

export interface FakeRegion extends HeldRegion { inflight: number; length: number; bytes: Uint8Array }

export function fakeRegion(length = 64): FakeRegion {
  return {
    inflight: 0,
    length,
    bytes: new Uint8Array(length),
    [HOLD]() { this.inflight++ },
    [RELEASE]() { this.inflight-- },
  }
}
