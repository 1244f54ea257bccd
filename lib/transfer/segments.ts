// Segments: named, registered memory an agent offers to its peers with
// rights (the security boundary). The local table is versioned; each change
// goes to every peer over the control channel. A peer's table is the mirror
// a transfer is checked against before anything is posted.
import { Access } from '../core/constants.js'
import { RdmaError } from '../core/errors.js'
import { describeValue } from '../core/validate.js'
import type { MemoryRegion } from '../verbs/memory.js'
import type { PlainMemory } from './plain-memory.js'
import { RemoteRegion } from '../verbs/remote.js'
import type { LinkGrants } from './grants.js'

/** What a peer may do to a segment with one-sided operations. */
export type SegmentRights = 'none' | 'read' | 'write' | 'read-write'
export const SEGMENT_RIGHTS: readonly SegmentRights[] = ['none', 'read', 'write', 'read-write']

/** The memory region access flags for rights: the device enforces them too. */
export function accessFor(rights: SegmentRights): number {
  let access = Access.LocalWrite
  if (rights === 'read' || rights === 'read-write') access |= Access.RemoteRead
  if (rights === 'write' || rights === 'read-write') access |= Access.RemoteWrite
  return access
}

export function allows(rights: SegmentRights, op: 'read' | 'write'): boolean {
  return rights === 'read-write' || rights === op
}

/** A segment's memory: a registered region (RDMA) or plain memory (TCP). */
export type SegmentMemory = MemoryRegion | PlainMemory

/**
 * A segment as it travels to peers: [name, address (hex), rkey, length,
 * rights], and for a per-peer grant over RDMA the rkey of each data QP of
 * the link (a type 2 window is valid on the QP that bound it only); an agent
 * with several rails (rails.ts) adds, for a shared segment, the rkey of its
 * memory on each rail (null in the per-QP place).
 */
export type SegmentEntry = [string, string, number, number, SegmentRights] | [string, string, number, number, SegmentRights, number[]]
  | [string, string, number, number, SegmentRights, null, number[]]

/** Who a segment is granted to: every peer alike (its region's key), or named peers (or 'any' peer), each through grants of its own. */
export type SegmentPeers = 'any' | readonly string[]

/** The peers a per-peer segment is granted to now. */
export class GrantList {
  readonly #any: boolean
  readonly #names: Set<string>
  readonly #revoked = new Set<string>()
  constructor(peers: SegmentPeers) {
    this.#any = peers === 'any'
    this.#names = new Set(peers === 'any' ? [] : peers)
  }

  allows(peerName: string): boolean { return this.#any ? !this.#revoked.has(peerName) : this.#names.has(peerName) }
  add(peerName: string): void { this.#revoked.delete(peerName); this.#names.add(peerName) }
  remove(peerName: string): void { this.#revoked.add(peerName); this.#names.delete(peerName) }
  /** The names granted now ('any': every peer but those revoked). */
  describe(): SegmentPeers { return this.#any ? 'any' : [...this.#names] }
}

/** A segment of this agent. */
export class Segment {
  #withdrawn = false
  /** @internal index in this agent's columns (stable for the segment's life) */
  readonly index: number
  /** @internal per-peer grants (register's `peers`); undefined: every peer uses the region's key */
  readonly grants: GrantList | undefined
  /** @internal the links' grants of it now, with the peer name each was made for (grants.ts) */
  readonly holders = new Map<LinkGrants, string>()
  constructor(readonly name: string, readonly region: SegmentMemory, readonly rights: SegmentRights, index: number, peers?: SegmentPeers,
    /** @internal the same memory registered on rails 1.. (rails.ts); empty with one rail */
    readonly railRegions: readonly SegmentMemory[] = []) {
    this.index = index
    this.grants = peers === undefined ? undefined : new GrantList(peers)
  }

  /** @internal the segment's memory as rail `rail`'s device knows it */
  regionOn(rail: number): SegmentMemory { return rail === 0 ? this.region : this.railRegions[rail - 1]! }

  /** 'shared': every peer reaches it by its region's key; else the peers it is granted to, each through grants of its own ('any': every peer not revoked). */
  get peers(): 'shared' | SegmentPeers { return this.grants ? this.grants.describe() : 'shared' }

  get length(): number { return this.region.length }
  /** The segment's bytes (a view of its memory). */
  get bytes(): Uint8Array { return this.region.bytes }
  /** True once unregistered: transfers naming it are refused. */
  get withdrawn(): boolean { return this.#withdrawn }
  /** @internal */
  withdraw(): void { this.#withdrawn = true }

  /** @internal the wire form sent to peers; `keys`: a per-peer grant's rkey per data QP */
  entry(keys?: readonly number[]): SegmentEntry {
    const d = this.region.describe()
    if (keys === undefined && this.railRegions.length > 0) {
      return [this.name, d.addr, d.rkey, this.region.length, this.rights, null, [d.rkey, ...this.railRegions.map((r) => r.describe().rkey)]]
    }
    if (keys === undefined) return [this.name, d.addr, d.rkey, this.region.length, this.rights]
    return [this.name, d.addr, keys[0]!, this.region.length, this.rights, [...keys]]
  }
}

/** A segment of a peer, as its table says. */
export class RemoteSegment {
  readonly region: RemoteRegion
  #withdrawn = false
  constructor(readonly name: string, addr: string, rkey: number, readonly length: number, public rights: SegmentRights, readonly index: number,
    /** @internal a per-peer grant's rkey per data QP (lane), else undefined (region.rkey on every lane) */
    readonly laneKeys?: Uint32Array) {
    this.region = new RemoteRegion(BigInt(addr), rkey, length)
  }

  get withdrawn(): boolean { return this.#withdrawn }
  /** @internal */
  withdraw(): void { this.#withdrawn = true }
}

export function segmentError(code: 'ERR_SEGMENT_UNKNOWN' | 'ERR_SEGMENT_RIGHTS' | 'ERR_SEGMENT_WITHDRAWN' | 'ERR_SEGMENT_EXISTS', message: string): RdmaError {
  return new RdmaError(message, { code })
}

/** This agent's segments, by name, with a version that grows on every change. */
export class LocalTable {
  readonly byName = new Map<string, Segment>()
  readonly byIndex: Segment[] = []
  /** Segment lengths by index; an unregistered segment's length becomes 0 (indexes are never reused). */
  readonly lengths: number[] = []
  version = 0

  add(name: string, region: SegmentMemory, rights: SegmentRights, peers?: SegmentPeers, railRegions?: readonly SegmentMemory[]): Segment {
    if (this.byName.has(name)) throw segmentError('ERR_SEGMENT_EXISTS', `A segment named '${name}' is registered already`)
    const segment = new Segment(name, region, rights, this.lengths.length, peers, railRegions)
    this.lengths.push(region.length)
    this.byIndex.push(segment)
    this.byName.set(name, segment)
    this.version++
    return segment
  }

  remove(segment: Segment): void {
    if (this.byName.get(segment.name) !== segment) return
    this.byName.delete(segment.name)
    segment.withdraw()
    this.lengths[segment.index] = 0 // any block naming it is now out of range
    this.version++
  }

  /** The segment `ref` names (a Segment of this agent, or a name), checked to be registered. */
  resolve(ref: unknown): Segment {
    if (ref instanceof Segment) {
      if (ref.withdrawn || this.byName.get(ref.name) !== ref) throw segmentError('ERR_SEGMENT_WITHDRAWN', `Segment '${ref.name}' was unregistered`)
      return ref
    }
    const segment = typeof ref === 'string' ? this.byName.get(ref) : undefined
    if (!segment) throw segmentError('ERR_SEGMENT_UNKNOWN', `No local segment named ${describeValue(ref)}`)
    return segment
  }

  /**
   * The table as `peerName` may see it: the shared segments, and those
   * granted to it with the keys `grant` gives (binding them if need be).
   */
  async entriesFor(peerName: string, grant: (segment: Segment, peerName: string) => Promise<number[] | undefined>): Promise<SegmentEntry[]> {
    const entries: SegmentEntry[] = []
    for (const segment of [...this.byName.values()]) {
      if (!segment.grants) entries.push(segment.entry())
      else if (segment.grants.allows(peerName) && !segment.withdrawn) {
        let keys: number[] | undefined
        try {
          keys = await grant(segment, peerName)
        } catch (error) {
          if (segment.withdrawn || !segment.grants.allows(peerName)) continue // unregistered or revoked meanwhile: not in the table
          throw error
        }
        if (!segment.withdrawn) entries.push(segment.entry(keys))
      }
    }
    return entries
  }
}

/** A peer's segments as its messages describe them. */
export class RemoteTable {
  readonly byName = new Map<string, RemoteSegment>()
  readonly byIndex: RemoteSegment[] = []
  readonly lengths: number[] = []
  version = 0

  /**
   * `lanes`: the link's data lanes (a per-peer grant names a key for each),
   * `perRail` of them on each rail (rails.ts; a shared segment of a peer with
   * several rails names a key per rail).
   */
  add(entries: readonly SegmentEntry[], version: number, lanes: number, perRail = lanes): void {
    for (const [name, addr, rkey, length, rights, keys, railKeys] of entries) {
      let laneKeys: Uint32Array | undefined
      if (keys !== undefined && keys !== null) {
        if (!Array.isArray(keys) || keys.length !== lanes) throw new RdmaError(`The peer's grant of segment '${name}' names ${Array.isArray(keys) ? keys.length : 'no list of'} keys for ${lanes} lanes`, { code: 'ERR_TRANSFER_PROTOCOL' })
        laneKeys = Uint32Array.from(keys)
      } else if (lanes > perRail) {
        // Several rails on this link: the key of the segment's memory on each lane's rail.
        const rails = Math.ceil(lanes / perRail)
        if (!Array.isArray(railKeys) || railKeys.length < rails) throw new RdmaError(`The peer's segment '${name}' names ${Array.isArray(railKeys) ? railKeys.length : 'no'} rail keys for ${rails} rails`, { code: 'ERR_TRANSFER_PROTOCOL' })
        laneKeys = new Uint32Array(lanes)
        for (let l = 0; l < lanes; l++) laneKeys[l] = railKeys[Math.floor(l / perRail)]!
      }
      this.byName.get(name)?.withdraw()
      const segment = new RemoteSegment(name, addr, rkey, length, rights, this.byIndex.length, laneKeys)
      this.byIndex.push(segment)
      this.lengths.push(length)
      this.byName.set(name, segment)
    }
    this.version = Math.max(this.version, version)
  }

  remove(name: string, version: number): void {
    const segment = this.byName.get(name)
    if (segment) {
      segment.withdraw()
      this.lengths[segment.index] = 0
      this.byName.delete(name)
    }
    this.version = Math.max(this.version, version)
  }

  /** The peer's segment `name`, checked to allow `op`. */
  resolve(name: unknown, op: 'read' | 'write'): RemoteSegment {
    const segment = typeof name === 'string' ? this.byName.get(name) : undefined
    if (!segment) throw segmentError('ERR_SEGMENT_UNKNOWN', `The peer has no segment named ${describeValue(name)} (withdrawn, or never registered)`)
    if (!allows(segment.rights, op)) throw segmentError('ERR_SEGMENT_RIGHTS', `The peer's segment '${segment.name}' allows ${segment.rights}, not ${op}`)
    return segment
  }

  /** Withdraws every segment (the link they were valid on is gone). */
  clear(): void {
    for (const segment of this.byIndex) segment.withdraw()
    this.byName.clear()
  }
}
