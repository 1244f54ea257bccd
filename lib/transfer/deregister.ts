// The memory of a withdrawn segment goes once the peers released it
// (releases.ts) and no work request here names it. The caller of
// unregister() waits within its bound; the deregistration does not depend on
// that bound: a withdrawn segment never stays reachable by its rkey after
// the device is done with the work requests that named it (each one
// completes, fails, or is flushed when its link fails, all within the RC
// retry bounds).
import { bounded } from '../cm/index.js'
import { RdmaError } from '../core/errors.js'
import type { WaitOptions } from '../core/validate.js'
import type { Segment, SegmentMemory } from './segments.js'

/** Deregisters once idle; ERR_BUSY (a work request posted meanwhile, named directly) waits again. */
async function whenIdle(memory: SegmentMemory): Promise<void> {
  for (;;) {
    try {
      return await memory.deregisterWhenIdle()
    } catch (error) {
      if ((error as RdmaError).code !== 'ERR_BUSY') throw error
    }
  }
}

/**
 * Deregisters `segment`'s memory once `released` resolved (the peers' batches
 * naming it settled: releases.ts) and it is idle here. Resolves when it is
 * deregistered; rejects with ETIMEDOUT or ABORT_ERR when the caller's wait
 * ends first, and the deregistration still happens then.
 */
export async function deregisterWithdrawn(segment: Segment, wait: WaitOptions, released: Promise<void>): Promise<void> {
  // The other rails' registrations first: rail 0's region may own the memory they name (rails.ts).
  const idle = released.then(async () => {
    for (const region of segment.railRegions) await whenIdle(region)
    await whenIdle(segment.region)
  })
  idle.catch(() => undefined) // the caller may stop waiting: nobody else awaits it
  try {
    await bounded(idle, 'unregister', wait)
  } catch (error) {
    const code = (error as RdmaError).code
    if (code !== 'ETIMEDOUT' && code !== 'ABORT_ERR') throw error
    const inflight = 'inflight' in segment.region ? segment.region.inflight : 0
    throw new RdmaError(`Segment '${segment.name}' is withdrawn, but its memory is still in use (${code === 'ETIMEDOUT' ? `after ${wait.timeoutMs} ms` : 'aborted'}; ${inflight} local work request(s), or peers' batches posted before the withdrawal): it is deregistered, its rkey refused, as soon as they are done`,
      { code, cause: error })
  }
}
