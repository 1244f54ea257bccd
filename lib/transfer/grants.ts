// Per-peer grants: a segment registered with `peers` is reachable by each
// peer it is granted to through grants of that peer's link alone, so one
// peer can be revoked while the others go on.
// RDMA: a type 2 memory window per data QP of the link, bound over exactly
// the segment (its region is registered without remote access, so the
// windows are the only way in); a type 2 window is valid on the QP that
// bound it only, so no other peer can use its rkey. Revoking closes the
// windows (ibv_dealloc_mw): the NIC refuses their rkeys from then on. (No
// LOCAL_INV: on Linux 6.1's Soft-RoCE one naming an unbound window resets
// the kernel, and closing needs no work request.) A device without memory
// windows falls back to the region's rkey: revoking then withdraws the
// table entry only (stats().grants says 'region').
// TCP: the link's set of granted keys, checked by the receiving code.
import { Access } from '../core/constants.js'
import { RdmaError } from '../core/errors.js'
import type { MemoryWindow } from '../verbs/memory-window.js'
import type { MemoryRegion } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { Segment, SegmentRights } from './segments.js'

/** Revokes every grant of `segment` (of `peerName` only, if given), on every link, adopted or still in its handshake. */
export async function revokeHolders(segment: Segment, peerName?: string): Promise<void> {
  const holders = [...segment.holders].filter(([, name]) => peerName === undefined || name === peerName)
  await Promise.all(holders.map(([grants]) => grants.revoke(segment)))
}

/** How per-peer grants are enforced: by the NIC per link ('windows'), not per peer ('region': no memory windows), or by this library's code ('software': TCP). */
export type GrantEnforcement = 'windows' | 'region' | 'software'

/** A link's grants of per-peer segments. */
export interface LinkGrants {
  /**
   * Grants `segment` on this link, to the peer `peerName`: the rkey of each
   * data lane (RDMA windows), or undefined (the segment's own key). The
   * segment lists the grant (Segment.holders) until it is revoked, so a
   * withdrawal reaches links still in their handshake too.
   */
  grant(segment: Segment, peerName: string): Promise<number[] | undefined>
  /** Revokes this link's grant of `segment` (resolves once its keys are refused). */
  revoke(segment: Segment): Promise<void>
  /** Whether `segment` is granted on this link now. */
  has(segment: Segment): boolean
  /** Revokes every grant (the link is going). */
  close(): void
}

/** The window access for `rights` (remote flags only: the region under it has local write). */
function windowAccess(rights: SegmentRights): number {
  let access = 0
  if (rights === 'read' || rights === 'read-write') access |= Access.RemoteRead
  if (rights === 'write' || rights === 'read-write') access |= Access.RemoteWrite
  return access
}

function withdrawnError(segment: Segment): RdmaError {
  return new RdmaError(`Segment '${segment.name}' was withdrawn or revoked while it was being granted`, { code: 'ERR_SEGMENT_WITHDRAWN' })
}

interface Granted { windows: MemoryWindow[]; bound: Promise<number[]>; revoked: boolean; settled: boolean }

/** RDMA: a type 2 window per data QP for each granted segment. */
export class WindowGrants implements LinkGrants {
  readonly #granted = new Map<Segment, Granted>()
  #closed = false

  /** `perRail`: QPs per rail (rails.ts): QP i binds on its own rail's PD, over the segment's memory as that rail registered it. */
  constructor(readonly pd: ProtectionDomain, readonly qps: readonly QueuePair[], readonly perRail = qps.length) {}

  grant(segment: Segment, peerName: string): Promise<number[]> {
    if (segment.withdrawn) return Promise.reject(withdrawnError(segment))
    const known = this.#granted.get(segment)
    if (known && !known.revoked) return known.bound
    const granted: Granted = { windows: [], bound: Promise.resolve([]), revoked: false, settled: false }
    granted.bound = this.#bind(segment, granted)
    granted.bound.then(() => { granted.settled = true }, () => { granted.settled = true })
    granted.bound.catch(() => this.#drop(segment, granted))
    this.#granted.set(segment, granted)
    segment.holders.set(this, peerName)
    return granted.bound
  }

  /**
   * One window per QP, each bound over the whole segment. Settles only when
   * every bind posted has settled (a bind completes at once on a live QP and
   * is flushed on a failed one), so its windows are never closed under a bind.
   */
  async #bind(segment: Segment, granted: Granted): Promise<number[]> {
    if (this.#closed) throw new RdmaError('The link was closed', { code: 'ERR_CLOSED' })
    const binds: Promise<{ rkey: number }>[] = []
    let failure: unknown
    try {
      const access = windowAccess(segment.rights)
      for (let i = 0; i < this.qps.length; i++) {
        const qp = this.qps[i]!
        // A QP of a rail that could not reach the peer (left in INIT: rdma-link.ts) binds nothing: key 0, which the peer's lane cannot use either.
        if (qp.state === 'INIT') {
          binds.push(Promise.resolve({ rkey: 0 }))
          continue
        }
        const region = segment.regionOn(Math.floor(i / this.perRail)) as MemoryRegion
        const window = qp.pd.allocMemoryWindow(2)
        granted.windows.push(window)
        binds.push(qp.bindWindow(window, region.slice(0, region.length), access))
      }
    } catch (error) {
      failure = error
    }
    const settled = await Promise.allSettled(binds)
    if (failure !== undefined) throw failure
    const keys: number[] = []
    for (const result of settled) {
      if (result.status === 'rejected') throw result.reason
      keys.push(result.value.rkey)
    }
    if (granted.revoked || segment.withdrawn) throw withdrawnError(segment)
    return keys
  }

  has(segment: Segment): boolean {
    const granted = this.#granted.get(segment)
    return granted !== undefined && !granted.revoked
  }

  async revoke(segment: Segment): Promise<void> {
    const granted = this.#granted.get(segment)
    if (!granted) return
    granted.revoked = true
    await this.#drop(segment, granted)
  }

  /** Closes the windows once their binds settled (a window is never closed under its own bind). */
  async #drop(segment: Segment, granted: Granted): Promise<void> {
    this.#forget(segment, granted)
    await granted.bound.catch(() => undefined)
    for (const window of granted.windows) window.close()
  }

  #forget(segment: Segment, granted: Granted): void {
    granted.revoked = true
    if (this.#granted.get(segment) === granted) {
      this.#granted.delete(segment)
      segment.holders.delete(this)
    }
  }

  /**
   * Closes the windows whose binds settled now, before the link's QPs go: a
   * type 2 window bound to a QP holds it, and Soft-RoCE's QP destroy waits
   * for it. A bind still in flight is flushed by the QP's close; its window
   * is closed when it settles.
   */
  close(): void {
    this.#closed = true
    for (const [segment, granted] of [...this.#granted]) {
      if (!granted.settled) {
        void this.#drop(segment, granted)
        continue
      }
      this.#forget(segment, granted)
      for (const window of granted.windows) window.close()
    }
  }
}

/** A device without memory windows, or TCP: the segment's own key; granted on this link is a set (TCP's receiving code checks it). */
export class KeyGrants implements LinkGrants {
  /** Each granted segment's key (read at grant: a closed region has none to read). */
  readonly #granted = new Map<Segment, number>()
  readonly #keys = new Set<number>()

  grant(segment: Segment, peerName: string): Promise<undefined> {
    if (segment.withdrawn) return Promise.reject(withdrawnError(segment))
    const key = segment.region.describe().rkey
    this.#granted.set(segment, key)
    this.#keys.add(key)
    segment.holders.set(this, peerName)
    return Promise.resolve(undefined)
  }

  revoke(segment: Segment): Promise<void> {
    const key = this.#granted.get(segment)
    this.#granted.delete(segment)
    segment.holders.delete(this)
    if (key !== undefined) this.#keys.delete(key)
    return Promise.resolve()
  }

  has(segment: Segment): boolean { return this.#granted.has(segment) }
  /** TCP: whether the key of a per-peer segment is granted on this link. */
  hasKey(key: number): boolean { return this.#keys.has(key) }
  close(): void {
    for (const segment of this.#granted.keys()) segment.holders.delete(this)
    this.#granted.clear()
    this.#keys.clear()
  }
}
