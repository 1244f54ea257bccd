// Local slices checked for a work request: regions of the queue's PD, open,
// at most the queue's SGEs; turned into the SGEs the encoder writes.
import { RdmaError } from '../core/errors.js'
import { rangeError, typeError } from '../core/validate.js'
import type { Sge } from '../ops/encoder.js'
import { LocalSlice, type MemoryRegion } from './memory.js'
import type { ProtectionDomain } from './protection-domain.js'

/** A region of another PD: the device would refuse it later, with a less clear error. */
export function wrongPd(name: string): RdmaError {
  return new RdmaError(`${name}: the region belongs to another protection domain than the queue`, { code: 'ERR_WRONG_PD' })
}

/** Validates local slices (regions of `pd`) and returns their SGEs and regions. */
export function localSges(local: unknown, name: string, maxSge: number, pd: ProtectionDomain): { sges: Sge[]; regions: MemoryRegion | MemoryRegion[]; length: number } {
  if (local instanceof LocalSlice) { // the common case: one slice
    const region = local.region
    region.assertUsable()
    if (region.pd !== pd) throw wrongPd(name)
    const length = local.length
    const sges = length > 0 ? [{ address: region.address + local.offset, length, lkey: region.lkey }] : []
    return { sges, regions: region, length }
  }
  const slices = Array.isArray(local) ? local : [local]
  if (slices.length > maxSge) throw rangeError(`at most ${maxSge} slices (the queue's max SGEs)`, name, slices.length)
  const sges: Sge[] = []
  const regions: MemoryRegion[] = []
  let length = 0
  for (const slice of slices) {
    if (!(slice instanceof LocalSlice)) throw typeError('a LocalSlice (region.slice())', name, slice)
    slice.region.assertUsable()
    if (slice.region.pd !== pd) throw wrongPd(name)
    if (slice.length > 0) sges.push({ address: slice.address, length: slice.length, lkey: slice.lkey })
    regions.push(slice.region)
    length += slice.length
  }
  return { sges, regions, length }
}
