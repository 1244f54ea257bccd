// A peer as the user holds it: a stable handle over the links that come and
// go (a failed link is replaced by a fresh one on the next transfer).
import { RdmaError } from '../core/errors.js'
import { PeerCounters, type PeerStats } from './stats.js'
import type { Link } from './link.js'
import type { SegmentRights } from './segments.js'

export type PeerState = 'connected' | 'broken' | 'closed'

/** What a peer offers: one of its segments as its table says. */
export interface RemoteSegmentInfo { name: string; length: number; rights: SegmentRights }

export class Peer {
  /** @internal */ readonly counters = new PeerCounters()
  /** @internal */ link: Link | undefined
  /** @internal */ relinking: Promise<Link> | undefined
  /** @internal the address to reconnect to (the side that connected), else undefined */
  readonly address: { host: string; port: number } | undefined
  /** @internal reached by its name in the cluster metadata: a reconnect looks the name up again */
  byName = false
  #closed = false
  #name: string
  #id: string

  /** @internal */
  constructor(id: string, name: string, link: Link, address: { host: string; port: number } | undefined) {
    this.#id = id
    this.#name = name
    this.link = link
    this.address = address
  }

  /** The peer agent's id, its incarnation (a restarted peer process has a new one). */
  get id(): string { return this.#id }

  /** @internal */
  rename(id: string): void { this.#id = id }

  /** The name the peer's agent gave itself. */
  get name(): string { return this.#name }

  get state(): PeerState {
    if (this.#closed) return 'closed'
    return this.link?.healthy ? 'connected' : 'broken'
  }

  /** The error that broke the current link, if it broke. */
  get error(): RdmaError | undefined { return this.link?.healthy ? undefined : this.link?.error }

  /** The peer's segments as its latest table says (empty while broken). */
  get segments(): ReadonlyMap<string, RemoteSegmentInfo> {
    const out = new Map<string, RemoteSegmentInfo>()
    if (this.link?.healthy) for (const [name, s] of this.link.remote.byName) out.set(name, { name, length: s.length, rights: s.rights })
    return out
  }

  stats(): PeerStats { return this.counters.snapshot() }

  /** @internal */
  adopt(link: Link): void {
    this.link = link
    this.#name = link.peerName
  }

  /** @internal */
  markClosed(): void { this.#closed = true }
}
