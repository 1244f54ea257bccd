// The seam between the agent and how bytes move: a transport listens for
// peers, dials them, and gives segments their memory. 'rdma' (rdma-transport.ts)
// opens a device and moves bytes with one-sided RDMA; 'tcp' (tcp/transport.ts)
// opens none and moves them over a socket, the receiving agent's code placing
// them. Both produce Links (link.ts) the rest of the engine drives alike.
import type { Device } from '../verbs/device.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import type { RegisterableMemory } from '../verbs/memory.js'
import type { Link } from './link.js'
import type { SegmentEntry, SegmentMemory, SegmentRights } from './segments.js'
import type { Admission } from './admission.js'
import type { GrantEnforcement, LinkGrants } from './grants.js'

/** How an agent moves bytes: RDMA verbs, or a TCP socket (no device). */
export type TransportKind = 'rdma' | 'tcp'
/** What TransferAgent.create() takes: a transport, or 'auto' (RDMA when a device serves the host address, else TCP). */
export type TransportOption = TransportKind | 'auto'
export const TRANSPORT_OPTIONS: readonly TransportOption[] = ['rdma', 'tcp', 'auto']

/** One place a transport listens on, and its device ('tcp' for TCP). */
export interface ListenAddress { host: string; port: number; device: string }

/** What every link of an agent gets, whatever the transport. */
export interface AgentLinkSettings {
  agent: string
  name: string
  /** Data lanes (RDMA: QPs) per link the connecting side asks for. */
  qps: number
  queueDepth: number
  batchWrs: number
  /** RDMA: the data CQs' poll mode. */
  pollMode: 'event' | 'busy'
  /** The local table as the peer `peerName` may see it, taken when it is sent (per-peer segments granted through `grants`). */
  table: (peerName: string, grants: LinkGrants) => Promise<{ entries: SegmentEntry[]; version: number }>
  /** Who may connect (options.admission, checked); undefined: every agent. */
  admission: Admission | undefined
}

export interface Transport {
  readonly kind: TransportKind
  /** RDMA: the device opened; TCP: none. */
  readonly device: Device | undefined
  readonly pd: ProtectionDomain | undefined
  /** The port peers connect to (0 before listen()). */
  readonly port: number
  /** Where peers reach it, after listen(): one address per rail (RDMA), rail 0's (host:port) first. */
  addresses(): ListenAddress[]
  /** Listens on host:port; every connect attempt of a peer is handed over as the link its handshake will give. */
  listen(host: string, port: number, accepted: (link: Promise<Link>) => void): Promise<void>
  /** How per-peer grants are enforced on this transport. */
  readonly grants: GrantEnforcement
  /**
   * A segment's memory: the memory given (or `size` new bytes), reachable by
   * peers with `rights`; `perPeer`: only through per-peer grants (RDMA with
   * memory windows: a region without remote access of its own).
   */
  register(source: RegisterableMemory | number, rights: SegmentRights, perPeer: boolean): SegmentMemory
  /** RDMA with several rails (rails.ts): `region`'s memory registered on each other rail too; else none. */
  registerRails?(region: SegmentMemory, rights: SegmentRights, perPeer: boolean): SegmentMemory[]
  /** A link to the agent at host:port (with `incarnation`: that incarnation only, else ERR_STALE_PEER). */
  connect(host: string, port: number, timeoutMs: number, signal?: AbortSignal, incarnation?: string): Promise<Link>
  /** Stops listening (connect attempts from now on are refused). */
  stop(): void
  /** Releases what the transport opened (after every link is closed). */
  close(): void
}
