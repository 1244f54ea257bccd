// The options, events and results of a TransferAgent (agent.ts).
import type { WaitOptions } from '../core/validate.js'
import type { RdmaError } from '../core/errors.js'
import type { RegisterableMemory } from '../verbs/memory.js'
import type { Peer } from './peer.js'
import type { SegmentPeers, SegmentRights } from './segments.js'
import type { GrantEnforcement } from './grants.js'
import type { PeerStats } from './stats.js'
import type { TransportKind, TransportOption } from './transport.js'
import type { TransferProgressListener } from './run.js'
import type { AdmissionOptions } from './admission.js'
import type { MetadataSetting, MetadataStateEvent, PeerLeftEvent, PeerRecord } from './metadata/index.js'

export interface TransferAgentOptions {
  /** Address to listen on (RDMA: an address of the device). */
  host: string
  /** 0 (default) picks a free port: see agent.port. */
  port?: number
  /**
   * How bytes move (default 'rdma'): 'rdma' opens a device; 'tcp' opens none
   * and moves them over a socket; 'auto' is RDMA when a device serves `host`,
   * else TCP (with a one-time process warning). See docs/transfer.md, "Transports".
   */
  transport?: TransportOption
  /** RDMA: the device (default: the one that has `host`, else the first active one). */
  device?: string
  /**
   * RDMA: several devices (rails) to move data on, e.g. ['mlx5_0', 'mlx5_1']
   * (1..4, instead of `device`). The first must serve `host`: it carries the
   * control channel; each link to a peer that has rails too gets
   * `qpsPerPeer` data QPs on each rail both sides have. A transfer's slices
   * are shared between rails by their measured rate; a rail that fails has
   * its slices moved to the others. Not for the TCP transport
   * (ERR_INVALID_ARG_VALUE). See docs/rails.md.
   */
  devices?: readonly string[]
  /** A name peers see (default: a random id); with `metadata`, required: the agent's key in the cluster. */
  name?: string
  /**
   * Cluster metadata: etcd endpoints (['http://10.0.0.5:2379']) or
   * { endpoints, ttlSeconds, prefix, requestTimeoutMs }. The agent publishes
   * itself under its name with a lease and watches the others, so peers are
   * reached by name (connect('decode-3')). Without it (the default), peers
   * are reached by address only.
   */
  metadata?: MetadataSetting
  /** Data QPs per peer, 1..16 (default 2). The side that connects chooses. */
  qpsPerPeer?: number
  /** Largest work request, in bytes (default 64 KiB; never above the device's max message size). */
  sliceBytes?: number
  /** Send queue depth of each data QP (default 128). */
  queueDepth?: number
  /** Work requests per postBatch (one doorbell, one signaled completion; default 16). */
  batchWrs?: number
  /**
   * RDMA: how the data CQs are polled. 'event' (default): woken by the
   * device's completion channel. 'busy': polled from the event loop while
   * anything waits on them, which is always (the notification receives):
   * lower latency, a core kept busy (as perftest's tools keep one). TCP: ignored.
   */
  pollMode?: 'event' | 'busy'
  /**
   * ACK timeout of the data QPs, as the verbs exponent: the requester
   * retransmits after 4.096 µs × 2^ackTimeout without an ACK (0..31, default
   * 14 = 67 ms). See docs/softroce.md ("Retransmission on Soft-RoCE")
   * before lowering it.
   */
  ackTimeout?: number
  /**
   * Who may connect (default: every agent that speaks the protocol). `secret`:
   * peers must prove they hold the same one (a challenge-response in the
   * handshake; the secret never travels), and this agent connects only to
   * agents that prove it too. `allow`: the names of the peers admitted when
   * they connect here. A refused peer gets ERR_PEER_REFUSED and never sees a
   * segment. See docs/access.md, "Who may connect".
   */
  admission?: AdmissionOptions
  /** Bound on the handshake with a peer (default 10000 ms). */
  handshakeTimeoutMs?: number
  /**
   * Overall bound on a transfer that gives no timeoutMs (default: none: a
   * transfer that keeps progressing runs as long as it needs; the stall
   * bound ends a dead one).
   */
  transferTimeoutMs?: number
  /**
   * RDMA with several rails (`devices`): how long after a rail failed on a
   * link the next transfer to that peer (none running) makes the link anew,
   * with every rail, to try the failed one again (0..2^31 ms, default 5000;
   * 0: at the next transfer). See docs/rails.md.
   */
  railRetryMs?: number
  /** A transfer that gives no stallTimeoutMs fails with ERR_STALLED after this long without a completion (default 10000 ms). */
  stallTimeoutMs?: number
}

export interface RegisterOptions {
  /** Bytes of new, page-aligned memory for the segment... */
  size?: number
  /** ...or existing memory to register. */
  memory?: RegisterableMemory
  /** What peers may do to it (default 'none'). */
  remote?: SegmentRights
  /**
   * Who may reach it (default: every peer, through the region's key). The
   * names of the peers it is granted to, or 'any' (every peer, each through
   * grants of its own): only those see it, and revoke(peer, name) takes one
   * peer's access away while the others go on. Over RDMA each grant is a
   * memory window per data QP of that peer's link, enforced by the NIC. See
   * docs/access.md, "Who may touch a segment".
   */
  peers?: SegmentPeers
}

export interface PeerConnectOptions extends WaitOptions {
  host: string
  port: number
}

/** 'peerLost': a peer's link failed (the handle stays; the next transfer reconnects or fails fast). */
export interface PeerLostEvent { peer: Peer; error: RdmaError }

/** The agent's events and their listeners' arguments. */
export interface TransferAgentEvents {
  /** A notification from a peer (its transfer's bytes are in place). */
  notification: [notification: Notification]
  /** A peer connected to this agent. */
  peer: [peer: Peer]
  peerLost: [event: PeerLostEvent]
  /** A peer's connect attempt failed on this side (coded); never thrown. */
  handshakeError: [error: Error]
  /** With metadata: an agent (a new incarnation) appeared in the cluster. */
  peerJoined: [record: PeerRecord]
  /** With metadata: an agent left the cluster; the links to that incarnation were failed with ERR_PEER_GONE first. */
  peerLeft: [event: PeerLeftEvent]
  /** With metadata: the agent's standing with etcd changed. */
  metadata: [event: MetadataStateEvent]
}

/** A notification's payload: a string, or bytes (up to 1 KiB either way). */
export type NotificationMessage = string | Uint8Array

export interface TransferOptions extends WaitOptions {
  /** Sent to the peer after every byte of this transfer is in place (in call order per peer). */
  notify?: NotificationMessage
  /** Fails the transfer with ERR_STALLED after this many ms without a completion (default: the agent's stallTimeoutMs). */
  stallTimeoutMs?: number
  /** Called with the bytes confirmed so far and the total, at most once per completed batch. */
  onProgress?: TransferProgressListener
}

export interface Notification {
  peer: Peer
  /** A string as sent, or a Buffer for bytes. */
  message: string | Buffer
}

export interface AgentStats {
  /** The transport this agent runs on ('auto' resolved). */
  transport: TransportKind
  /**
   * How per-peer grants (register's `peers`) are enforced: 'windows' (RDMA: a
   * memory window per peer's QP, refused by the NIC once revoked), 'region'
   * (RDMA device without memory windows: every granted peer uses the region's
   * key; revoking withdraws the table entry only), 'software' (TCP: the
   * receiving agent's code checks each link's grants).
   */
  grants: GrantEnforcement
  total: PeerStats
  /** By peer id. */
  peers: Record<string, PeerStats & { name: string; state: string }>
  /** RDMA: each rail's device (options.devices, else the one device) and the bytes its completions confirmed; TCP: empty. */
  rails: RailStats[]
}

/** One rail's share of what the agent moved (stats().rails): bytes its completions confirmed, and the times it failed on a link (its slices then went to the other rails). */
export interface RailStats { device: string; bytes: number; failovers: number }

/** A plan checked once by agent.prepare(), to run many times. */
