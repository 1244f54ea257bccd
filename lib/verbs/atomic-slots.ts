// 8-byte slots of library-owned memory where the old values of atomics land
// when the caller names no result slot: one pool per protection domain, in
// pages of 512 registered on first need. Reached through atomicSlotsOf(),
// which is not on the package entry: user code cannot take or give slots.
import { Access } from '../core/constants.js'
import type { LocalSlice } from './memory.js'
import type { ProtectionDomain } from './protection-domain.js'

const SLOT = 8
const SLOTS_PER_PAGE = 512

export class AtomicSlotPool {
  readonly #pd: ProtectionDomain
  readonly #free: LocalSlice[] = []

  constructor(pd: ProtectionDomain) { this.#pd = pd }

  /** A free slot; registers a page of them when none is left (a failure, e.g. the memlock limit, throws). */
  take(): LocalSlice {
    if (this.#free.length === 0) {
      // The free slots (and the requests using the others) keep the region alive.
      const region = this.#pd.allocRegion(SLOT * SLOTS_PER_PAGE, Access.LocalWrite)
      for (let i = 0; i < SLOTS_PER_PAGE; i++) this.#free.push(region.slice(i * SLOT, SLOT))
    }
    return this.#free.pop()!
  }

  /** The device is done with `slice`: free again. */
  give(slice: LocalSlice): void {
    this.#free.push(slice)
  }
}

// Keyed by the PD, collected with it (its regions close with it).
const pools = new WeakMap<ProtectionDomain, AtomicSlotPool>()

/** The atomic slots of `pd`, for its queue pairs. */
export function atomicSlotsOf(pd: ProtectionDomain): AtomicSlotPool {
  let pool = pools.get(pd)
  if (pool === undefined) pools.set(pd, pool = new AtomicSlotPool(pd))
  return pool
}
