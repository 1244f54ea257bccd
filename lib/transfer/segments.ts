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

/** A segment as it travels to peers: [name, address (hex), rkey, length, rights]. */
export type SegmentEntry = [string, string, number, number, SegmentRights]

/** A segment of this agent. */
export class Segment {
  #withdrawn = false
  /** @internal index in this agent's columns (stable for the segment's life) */
  readonly index: number
  constructor(readonly name: string, readonly region: SegmentMemory, readonly rights: SegmentRights, index: number) {
    this.index = index
  }

  get length(): number { return this.region.length }
  /** The segment's bytes (a view of its memory). */
  get bytes(): Uint8Array { return this.region.bytes }
  /** True once unregistered: transfers naming it are refused. */
  get withdrawn(): boolean { return this.#withdrawn }
  /** @internal */
  withdraw(): void { this.#withdrawn = true }

  /** @internal the wire form sent to peers */
  entry(): SegmentEntry {
    const d = this.region.describe()
    return [this.name, d.addr, d.rkey, this.region.length, this.rights]
  }
}

/** A segment of a peer, as its table says. */
export class RemoteSegment {
  readonly region: RemoteRegion
  #withdrawn = false
  constructor(readonly name: string, addr: string, rkey: number, readonly length: number, public rights: SegmentRights, readonly index: number) {
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

  add(name: string, region: SegmentMemory, rights: SegmentRights): Segment {
    if (this.byName.has(name)) throw segmentError('ERR_SEGMENT_EXISTS', `A segment named '${name}' is registered already`)
    const segment = new Segment(name, region, rights, this.lengths.length)
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

  entries(): SegmentEntry[] {
    return [...this.byName.values()].map((s) => s.entry())
  }
}

/** A peer's segments as its messages describe them. */
export class RemoteTable {
  readonly byName = new Map<string, RemoteSegment>()
  readonly byIndex: RemoteSegment[] = []
  readonly lengths: number[] = []
  version = 0

  add(entries: readonly SegmentEntry[], version: number): void {
    for (const [name, addr, rkey, length, rights] of entries) {
      this.byName.get(name)?.withdraw()
      const segment = new RemoteSegment(name, addr, rkey, length, rights, this.byIndex.length)
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
