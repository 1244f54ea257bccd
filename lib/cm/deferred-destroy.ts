// Destroying a connected rdma_cm id sends a MAD to the peer (a DREQ, or a REJ
// while connecting). On rxe (Linux 6.1) a MAD sent while the local port is
// down fails in the GSI QP, which flushes its receive queue; the MAD layer
// never refills it, so that host receives no rdma_cm message again until its
// rxe device is re-created (docs/reliability.md, "Link flaps"). So an id whose
// port is down is destroyed only once the port is ACTIVE again.
import type { NativeCmId } from '../native/addon.js'

const POLL_MS = 250
// The port must read ACTIVE at two polls in a row: the netdev's routes and
// carrier settle around the PORT_ACTIVE transition.
const ACTIVE_POLLS = 2

const waiting = new Map<NativeCmId, number>() // id -> consecutive ACTIVE polls
let timer: NodeJS.Timeout | undefined

/**
 * false when `id`'s port is ACTIVE: the caller destroys it now. Otherwise
 * true: `id` is destroyed once its port is ACTIVE again.
 */
export function deferDestroyWhilePortDown(id: NativeCmId): boolean {
  if (portActive(id)) return false
  waiting.set(id, 0)
  // Unref'd: a process may exit with ids waiting (the kernel then destroys them).
  timer ??= setInterval(poll, POLL_MS).unref()
  return true
}

function poll(): void {
  for (const [id, polls] of waiting) {
    if (!portActive(id)) waiting.set(id, 0)
    else if (polls + 1 < ACTIVE_POLLS) waiting.set(id, polls + 1)
    else {
      waiting.delete(id)
      destroy(id)
    }
  }
  if (waiting.size === 0) {
    clearInterval(timer)
    timer = undefined
  }
}

function portActive(id: NativeCmId): boolean {
  try {
    return id.portActive()
  } catch {
    return true // closed already, or its device is gone: nothing to wait for
  }
}

function destroy(id: NativeCmId): void {
  try {
    id.close()
  } catch {
    // rdma_destroy_id failed: the kernel releases the id with the process
  }
}
