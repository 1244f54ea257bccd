// The transfer agent: registers segments, listens for and connects to peers,
// and moves blocks between its segments and theirs (write = push, read =
// pull), with notifications that reach the peer after the data.
import { EventEmitter } from 'node:events'
import { randomUUID } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import { bounded } from '../cm/index.js'
import type { Device } from '../verbs/device.js'
import { RdmaError } from '../core/errors.js'
import type { RegisterableMemory } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import { integer, object, oneOf, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import type { ControlMessage } from './control.js'
import { decodeNotification, encodeNotification, noticePayload, NotificationFeed, type NoticePayload } from './notifications.js'
import type { Link } from './link.js'
import { agentSettings, chooseTransport, progressOptions, type ProgressOptions } from './agent-settings.js'
import { Peer } from './peer.js'
import { checkBlocks, isCurrent, recheck, segmentsUsed, type Blocks, type TransferOp } from './plan.js'
import type { TransferResult } from './run.js'
import { launch, type Launcher } from './launch.js'
import { TransferPlan } from './transfer-plan.js'
import { LocalTable, SEGMENT_RIGHTS, type Segment, type SegmentMemory } from './segments.js'
import { announce, resync } from './resync.js'
import { checkPeers, isGrantName } from './grant-options.js'
import { revokeHolders, type LinkGrants } from './grants.js'
import { markResumable, resume, type ResumeOptions, type ResumeResult } from './resume.js'
import type { TransferError } from './transfer-error.js'
import { deregisterWithdrawn } from './deregister.js'
import { Releases } from './releases.js'
import type { Transport, TransportKind } from './transport.js'
import { RdmaTransport } from './rdma-transport.js'
import { TcpTransport } from './tcp/transport.js'
import { totalStats } from './stats.js'
import type { TransferAgentOptions, RegisterOptions, PeerConnectOptions, TransferAgentEvents, NotificationMessage, TransferOptions, Notification, AgentStats } from './agent-options.js'
import { dialAddresses } from './dial.js'
import { EtcdRegistry, metadataSettings, isAgentName, isPeerRecord, NAME_RULE, type MetadataState, type PeerLeftEvent, type PeerRecord } from './metadata/index.js'

/** Typed listener methods (the rest of EventEmitter is Node's). */
export interface TransferAgent {
  on<E extends keyof TransferAgentEvents>(event: E, listener: (...args: TransferAgentEvents[E]) => void): this
  once<E extends keyof TransferAgentEvents>(event: E, listener: (...args: TransferAgentEvents[E]) => void): this
  off<E extends keyof TransferAgentEvents>(event: E, listener: (...args: TransferAgentEvents[E]) => void): this
}

export class TransferAgent extends EventEmitter {
  /** This agent's id: its incarnation, new at every create(). */
  readonly id = randomUUID()
  readonly name: string
  /** RDMA: the device opened; TCP: none. */
  readonly device: Device | undefined
  /** RDMA: the protection domain of the segments; TCP: none. */
  readonly pd: ProtectionDomain | undefined
  /** The transport the agent runs on ('auto' resolved): stats().transport says it too. */
  readonly transport: TransportKind
  readonly host: string
  readonly qpsPerPeer: number
  readonly sliceBytes: number
  readonly #transport: Transport
  readonly #handshakeMs: number
  readonly #transferMs: number | undefined
  readonly #stallMs: number
  /** How long after a rail failed a link is made anew (on the next transfer) to retry it (rails.ts). */
  readonly #railRetryMs: number
  readonly #table = new LocalTable()
  readonly #peers = new Map<string, Peer>()
  readonly #feed = new NotificationFeed()
  readonly #releases = new Releases()
  /** Handshakes under way by name or record, by the incarnation dialed. */
  readonly #connecting = new Map<string, Promise<Peer>>()
  #registry: EtcdRegistry | undefined
  #closed = false
  /** RDMA: the rails' device names (rails.ts), and the bytes each moved (confirmed by completions). */
  readonly #railNames: string[]
  readonly #railBytes: number[]
  /** Times each rail failed on a link and its slices moved to the others. */
  readonly #railFailovers: number[]
  /** What every transfer's launch needs of this agent, made once. */
  readonly #launcher: Launcher = {
    linkFailed: (peer, link, error) => this.#linkFailed(peer, link, error),
    railBytes: (rail, bytes) => { this.#railBytes[rail] = this.#railBytes[rail]! + bytes },
    failed: (error, peer, op, blocks) => markResumable(error, this, peer, op, blocks),
  }

  private constructor(options: TransferAgentOptions, kind: TransportKind, device: Device | undefined, rails: Device[]) {
    super()
    this.host = options.host
    this.name = options.name ?? this.id
    const settings = agentSettings(options, device)
    this.qpsPerPeer = settings.qpsPerPeer
    this.sliceBytes = settings.sliceBytes
    this.#transferMs = settings.transferMs
    this.#stallMs = settings.stallMs
    this.#handshakeMs = settings.handshakeMs
    this.#railRetryMs = settings.railRetryMs
    const links = {
      agent: this.id, name: this.name, qps: this.qpsPerPeer, queueDepth: settings.queueDepth, batchWrs: settings.batchWrs, pollMode: settings.pollMode, admission: settings.admission,
      table: async (peerName: string, grants: LinkGrants) => {
        const version = this.#table.version
        return { entries: await this.#table.entriesFor(peerName, (s, name) => grants.grant(s, name)), version }
      },
    }
    this.#transport = device ? new RdmaTransport(device, links, settings.ackTimeout, this.#handshakeMs, rails) : new TcpTransport(links, this.#handshakeMs)
    this.#railNames = device ? [device.name, ...rails.map((d) => d.name)] : []
    this.#railBytes = new Array<number>(this.#railNames.length).fill(0)
    this.#railFailovers = new Array<number>(this.#railNames.length).fill(0)
    this.transport = kind
    this.device = this.#transport.device
    this.pd = this.#transport.pd
  }

  /**
   * Opens the transport (RDMA: the device; TCP: nothing), and listens for peers on host:port. With `metadata`,
   * also registers in etcd (rejects with ERR_METADATA_UNAVAILABLE when etcd
   * does not answer within its request bound).
   */
  static async create(options: TransferAgentOptions): Promise<TransferAgent> {
    const o = object(options, 'options') as unknown as TransferAgentOptions
    if (typeof o.host !== 'string') throw typeError('an IP address', 'options.host', o.host)
    const port = integer(o.port ?? 0, 'options.port', 0, 65535)
    const metadata = o.metadata === undefined ? undefined : metadataSettings(o.metadata)
    if (metadata && !isAgentName(o.name)) throw typeError(`${NAME_RULE} (with options.metadata the name is the agent's key)`, 'options.name', o.name)
    const { kind, device, rails } = chooseTransport(o)
    let agent: TransferAgent | undefined
    try {
      agent = new TransferAgent(o, kind, device, rails)
      await agent.#transport.listen(o.host, port, (accepting) => agent!.#onAccepting(accepting))
      if (metadata) agent.#registry = await agent.#openRegistry(metadata)
      return agent
    } catch (error) {
      if (agent) agent.#transport.close()
      else for (const d of [...rails, ...(device ? [device] : [])]) d.close()
      throw error
    }
  }

  #openRegistry(settings: ReturnType<typeof metadataSettings>): Promise<EtcdRegistry> {
    return EtcdRegistry.open(settings, {
      name: this.name,
      incarnation: this.id,
      addresses: () => this.#transport.addresses(),
      segmentsVersion: () => this.#table.version,
    }, {
      joined: (record) => { if (!this.#closed) this.emit('peerJoined', record) },
      left: (event) => this.#onPeerLeft(event),
      state: (event) => { if (!this.#closed) this.emit('metadata', event) },
    })
  }

  /** With metadata: where this agent stands with etcd ('registered', 'unavailable', 'displaced', 'closed'); else undefined. */
  get metadataState(): MetadataState | undefined { return this.#registry?.state }

  /** With metadata: the other agents of the cluster as the watch has them now, by name (empty without metadata). */
  members(): ReadonlyMap<string, PeerRecord> { return this.#registry?.members() ?? new Map() }

  /** The port peers connect to. */
  get port(): number { return this.#transport.port }

  /** Peers connected to or from this agent, by id. */
  get peers(): ReadonlyMap<string, Peer> { return this.#peers }

  /** The segments registered now, by name. */
  get segments(): ReadonlyMap<string, Segment> { return this.#table.byName }

  // --- segments --------------------------------------------------------------

  /**
   * Registers memory as a named segment; peers see it (with `remote` rights)
   * at once: every peer, or with `peers` only those it is granted to (each
   * through grants of its own; see grant() and revoke()).
   */
  register(name: string, options: RegisterOptions): Segment {
    this.#assertOpen()
    if (typeof name !== 'string' || name.length === 0 || name.length > 128) throw typeError('a name of 1..128 characters', 'name', name)
    const o = object(options, 'options')
    const rights = oneOf(o.remote, 'options.remote', SEGMENT_RIGHTS, 'none')
    const peers = checkPeers(o.peers)
    if (this.#table.byName.has(name)) throw new RdmaError(`A segment named '${name}' is registered already`, { code: 'ERR_SEGMENT_EXISTS' })
    const region = this.#transport.register(o.memory !== undefined ? o.memory as RegisterableMemory : integer(o.size, 'options.size', 1, Number.MAX_SAFE_INTEGER), rights, peers !== undefined)
    let railRegions: SegmentMemory[] | undefined
    try {
      railRegions = this.#transport.registerRails?.(region, rights, peers !== undefined)
    } catch (error) {
      region.close()
      throw error
    }
    const segment = this.#table.add(name, region, rights, peers, railRegions)
    for (const link of this.#links()) announce(link, segment, this.#table.version)
    this.#registry?.publish()
    return segment
  }

  /**
   * Grants a per-peer segment (registered with `peers`) to the peer named
   * `peerName` too: connected peers of that name see it at once (through
   * grants of their own links), and so does one that connects later.
   */
  grant(peerName: string, segment: Segment | string): void {
    this.#assertOpen()
    const s = this.#perPeer(segment)
    if (!isGrantName(peerName)) throw typeError('a peer name of 1..128 characters', 'peerName', peerName)
    if (s.grants!.allows(peerName)) return
    s.grants!.add(peerName)
    for (const link of this.#links()) if (link.peerName === peerName) announce(link, s, this.#table.version)
  }

  /**
   * Takes a per-peer segment away from the peer(s) named `peer` (a Peer, or a
   * name): their grants are revoked first (RDMA: the windows are closed and
   * the NIC refuses their rkeys from then on, a batch of theirs in flight
   * included: it fails with REM_ACCESS_ERR, which breaks their link), then
   * they are told it is gone; every other peer goes on. Resolves once their
   * keys are refused. Not for a segment every peer shares (ERR_SEGMENT_SHARED).
   */
  async revoke(peer: Peer | string, segment: Segment | string): Promise<void> {
    this.#assertOpen()
    const s = this.#perPeer(segment)
    let peerName: string
    if (typeof peer === 'string' && isGrantName(peer)) peerName = peer
    else if (peer instanceof Peer) peerName = peer.name
    else throw typeError('a Peer or a peer name', 'peer', peer)
    s.grants!.remove(peerName)
    // Every link of that name, adopted or still in its handshake (resync() tells the latter).
    await revokeHolders(s, peerName)
    const v = this.#table.version
    for (const link of this.#links()) if (link.peerName === peerName) void link.sendTable(() => [{ t: 'del', v, name: s.name }])
  }

  /** A registered segment granted per peer (register's `peers`). */
  #perPeer(segment: Segment | string): Segment {
    const s = this.#table.resolve(segment)
    if (!s.grants) throw new RdmaError(`Segment '${s.name}' is shared by every peer through its region's key: register it with options.peers to grant and revoke it per peer`, { code: 'ERR_SEGMENT_SHARED' })
    return s
  }

  /** The links of the peers connected now. */
  #links(): Link[] {
    const links: Link[] = []
    for (const peer of this.#peers.values()) if (peer.link) links.push(peer.link)
    return links
  }

  /**
   * Withdraws a segment: peers are told at once (their transfers naming it
   * fail with ERR_SEGMENT_WITHDRAWN; one already posted is refused by the
   * device), local transfers naming it are refused, and the memory is
   * deregistered once no work request names it. Resolves then; a timeout or
   * abort (ETIMEDOUT, ABORT_ERR) ends the wait only: the memory is still
   * deregistered (its rkey refused) once the work requests are done.
   */
  async unregister(segment: Segment | string, options: WaitOptions = {}): Promise<void> {
    const wait = waitOptions(options)
    const s = this.#table.resolve(segment)
    this.#table.remove(s)
    const v = this.#table.version
    const links = this.#links()
    for (const link of links) void link.sendTable(() => [{ t: 'del', v, name: s.name }])
    this.#registry?.publish()
    // Peers that may have batches naming it in flight answer 'released' once those settled (within the stall bound).
    const released = s.rights === 'none' ? Promise.resolve() : this.#releases.wait(links, s.name, v, this.#stallMs)
    // Per-peer grants are revoked then (their windows hold the region: it deregisters after them), or at once when the caller stops waiting.
    const revoke = () => revokeHolders(s)
    try {
      await deregisterWithdrawn(s, wait, s.grants ? released.then(revoke) : released)
    } catch (error) {
      if (s.grants) await revoke()
      throw error
    }
  }

  // --- peers -----------------------------------------------------------------

  /**
   * Connects to a peer: data QPs set up, segment tables exchanged. The peer is
   * the agent at host:port; or, with metadata, the agent registered under a
   * name (looked up in the watched view, else in etcd; the handshake checks
   * its incarnation), or the exact incarnation a record names (ERR_STALE_PEER
   * if another one answers there). By name, an already connected peer is
   * returned as it is, and a broken one is reconnected under the same handle.
   */
  connect(options: PeerConnectOptions): Promise<Peer>
  connect(name: string, options?: WaitOptions): Promise<Peer>
  connect(record: PeerRecord, options?: WaitOptions): Promise<Peer>
  async connect(target: PeerConnectOptions | string | PeerRecord, options: WaitOptions = {}): Promise<Peer> {
    this.#assertOpen()
    if (typeof target === 'string' || isPeerRecord(target)) {
      const wait = waitOptions({ timeoutMs: this.#handshakeMs, ...optionalObject(options, 'options') })
      return typeof target === 'string' ? this.#connectByName(target, wait) : this.#connectRecord(target, wait)
    }
    const o = object(target, 'options')
    if (typeof o.host !== 'string') throw typeError('an IP address', 'options.host', o.host)
    const port = integer(o.port, 'options.port', 1, 65535)
    const wait = waitOptions({ timeoutMs: o.timeoutMs ?? this.#handshakeMs, signal: o.signal })
    const link = await this.#transport.connect(o.host, port, wait.timeoutMs!, wait.signal)
    return this.#adopt(link, { host: o.host, port })
  }

  #needRegistry(value: unknown): EtcdRegistry {
    if (!this.#registry) throw typeError('{ host, port } (connecting by name or record needs options.metadata)', 'options', value)
    return this.#registry
  }

  async #connectByName(name: string, wait: WaitOptions): Promise<Peer> {
    const registry = this.#needRegistry(name)
    if (!isAgentName(name)) throw typeError(NAME_RULE, 'name', name)
    // A healthy handle of that name first (after a restart the old incarnation's broken one may still be here).
    const named = [...this.#peers.values()].filter((p) => p.name === name)
    const known = named.find((p) => p.link?.healthy) ?? named[0]
    if (known) {
      known.byName = true
      await this.#linkOf(known, wait)
      return known
    }
    const deadline = Date.now() + wait.timeoutMs!
    const record = await registry.lookup(name, wait.timeoutMs!)
    return this.#connectRecord(record, { ...wait, timeoutMs: Math.max(1, deadline - Date.now()) })
  }

  async #connectRecord(record: PeerRecord, wait: WaitOptions): Promise<Peer> {
    this.#needRegistry(record)
    const existing = this.#peers.get(record.incarnation)
    if (existing?.link?.healthy) return existing
    // One handshake per incarnation at a time: a second link would replace the first on both sides, and a
    // write that completed on the first would lose its notification (the peer drops the replaced link's).
    let connecting = this.#connecting.get(record.incarnation)
    if (!connecting) {
      connecting = (async () => {
        const link = await this.#dial(record, wait)
        const peer = this.#adopt(link, undefined)
        peer.byName = true
        return peer
      })().finally(() => this.#connecting.delete(record.incarnation))
      this.#connecting.set(record.incarnation, connecting)
      return connecting
    }
    return bounded(connecting, 'connect', wait)
  }

  /**
   * A link to the incarnation `record` names: its addresses (one per rail) dialed in order, each within an
   * equal share of what is left of the bound, the next one when one does not answer (dialAddresses()).
   */
  #dial(record: PeerRecord, wait: WaitOptions): Promise<Link> {
    return dialAddresses(record, wait.timeoutMs ?? this.#handshakeMs, (address, timeoutMs) =>
      this.#transport.connect(address.host, address.port, timeoutMs, wait.signal, record.incarnation))
  }

  /** A peer left the cluster: the links to that incarnation fail now (not after RC retries), then listeners hear it. */
  #onPeerLeft(event: PeerLeftEvent): void {
    if (this.#closed) return
    for (const peer of this.#peers.values()) {
      const link = peer.link
      if (peer.id !== event.record.incarnation || !link?.healthy) continue
      this.#linkFailed(peer, link, new RdmaError(`Peer '${event.record.name}' left the cluster (${event.reason === 'replaced' ? 'a new incarnation took its name' : event.reason === 'missing' ? 'its record did not come back' : 'its lease expired or it closed'})`, { code: 'ERR_PEER_GONE' }))
    }
    this.emit('peerLeft', event)
  }

  #onAccepting(accepting: Promise<Link>): void {
    // A failed handshake is the peer's problem: it is reported, never thrown.
    accepting.then((link) => {
      // Closed meanwhile (its close delivered the handshake's last message): the link goes too.
      if (this.#closed) return link.close()
      this.emit('peer', this.#adopt(link, undefined))
    }, (error: unknown) => { if (!this.#closed) this.emit('handshakeError', error) })
  }

  #adopt(link: Link, address: { host: string; port: number } | undefined): Peer {
    if (this.#closed) {
      link.close()
      throw new RdmaError('The agent was closed', { code: 'ERR_CLOSED' })
    }
    let peer = this.#peers.get(link.peerAgent)
    if (peer && peer.link !== link) {
      peer.link?.fail(new RdmaError('The peer connected again', { code: 'ECONNRESET' }))
      peer.adopt(link)
      peer.counters.reconnects++
    } else if (!peer) {
      peer = new Peer(link.peerAgent, link.peerName, link, address)
      this.#peers.set(peer.id, peer)
    }
    resync(link, this.#table)
    link.onRailDown = (rail) => { this.#railFailovers[rail] = this.#railFailovers[rail]! + 1 }
    const owner = peer
    link.listen((message) => this.#onMessage(owner, link, message), (error) => this.#linkFailed(owner, link, error), (message) => this.#notified(owner, message))
    return peer
  }

  #onMessage(peer: Peer, link: Link, message: ControlMessage): void {
    switch (message.t) {
      case 'n': return this.#notified(peer, decodeNotification(message))
      case 'm':
        for (const item of message.list) this.#onMessage(peer, link, item)
        return
      case 'add': return link.remote.add(message.seg, message.v, link.lanes.length)
      case 'del': // answered once this side's batches posted before it settled: the peer deregisters then
        link.remote.remove(message.name, message.v)
        return void link.drained().then(() => link.broadcast({ t: 'released', v: message.v, name: message.name }))
      case 'released': return this.#releases.released(link, message.name, message.v)
      default: throw new RdmaError(`Unexpected control message ${JSON.stringify(message).slice(0, 100)}`, { code: 'ERR_TRANSFER_PROTOCOL' })
    }
  }

  /** A notification from `peer` (its data, if any, is in place). */
  #notified(peer: Peer, message: string | Buffer): void {
    peer.counters.notificationsReceived++
    const notification = { peer, message }
    this.emit('notification', notification)
    this.#feed.push(notification)
  }

  #linkFailed(peer: Peer, link: Link, error: Error): void {
    if (link.error) return
    this.#releases.linkGone(link)
    const coded = error instanceof RdmaError ? error : new RdmaError(error.message, { code: 'ECONNRESET', cause: error })
    // Each run fails once closing the QPs has delivered the completions already in the CQ (they count as landed).
    for (const run of link.runs) run.linkFailed(coded, 'the link to the peer failed')
    link.fail(coded)
    if (!this.#closed) this.emit('peerLost', { peer, error: coded })
  }

  /** Throws ERR_INVALID_ARG_TYPE unless `peer` is a Peer of this agent (a closed one is no longer). */
  #assertPeer(peer: Peer): void {
    if (!(peer instanceof Peer) || this.#peers.get(peer.id) !== peer) throw typeError('a Peer of this agent', 'peer', peer)
  }

  /**
   * The peer's link, fresh if the last one failed: a peer reached by name is
   * looked up again (a restarted one is reached at its new incarnation), one
   * reached by address is dialed there again; one that connected to this
   * agent fails fast, unless the metadata knows its name.
   */
  async #linkOf(peer: Peer, wait: WaitOptions): Promise<Link> {
    const healthy = this.#healthyLink(peer)
    if (healthy) return healthy
    const address = peer.address
    if (this.#registry && (peer.byName || (!address && isAgentName(peer.name)))) return this.#relinkByName(peer, this.#registry, wait)
    if (!address) {
      throw new RdmaError(`The link to peer ${peer.name} failed (${peer.link?.error?.code}); it connected to this agent, so it must connect again`, { code: 'ERR_PEER_GONE', cause: peer.link?.error })
    }
    // One attempt for every caller, bounded by the handshake bound alone; each caller waits within its own bound.
    peer.relinking ??= this.#transport.connect(address.host, address.port, this.#handshakeMs).then((link) => {
      peer.relinking = undefined
      this.#relinked(peer, link, address)
      return link
    }, (error: unknown) => {
      peer.relinking = undefined
      throw new RdmaError(`Cannot reconnect to peer ${peer.name} at ${address.host}:${address.port}: ${(error as Error).message}`, { code: (error as RdmaError).code ?? 'ECONNREFUSED', cause: error })
    })
    return bounded(peer.relinking, 'reconnect', wait)
  }

  /** The peer's link if it is healthy now, else undefined (#linkOf makes a fresh one); throws what #linkOf rejects with first. */
  #healthyLink(peer: Peer): Link | undefined {
    this.#assertOpen()
    this.#assertPeer(peer)
    if (peer.state === 'closed') throw new RdmaError('The peer was closed', { code: 'ERR_CLOSED' })
    const link = peer.link
    if (!link?.healthy) return undefined
    // A rail failed on it a while ago and nothing runs on it: made anew (every rail again), if this side can dial the peer.
    if (link.railDownAt > 0 && link.runs.size === 0 && performance.now() - link.railDownAt >= this.#railRetryMs && (peer.address || peer.byName)) {
      this.#releases.linkGone(link)
      link.fail(new RdmaError('The link is made anew to retry a rail that failed', { code: 'ECONNRESET' }))
      return undefined
    }
    return link
  }

  /** A new link under an old handle; another agent (a restarted process) answering keeps the handle with its new identity. */
  #relinked(peer: Peer, link: Link, address: { host: string; port: number } | undefined): void {
    if (link.peerAgent !== peer.id) {
      this.#peers.delete(peer.id)
      peer.rename(link.peerAgent)
      this.#peers.set(peer.id, peer)
    }
    this.#adopt(link, address)
  }

  /** Looks the peer's name up again and dials the incarnation registered now; a name nobody has any more is ERR_PEER_GONE. */
  #relinkByName(peer: Peer, registry: EtcdRegistry, wait: WaitOptions): Promise<Link> {
    peer.relinking ??= (async () => {
      const deadline = Date.now() + this.#handshakeMs
      let record: PeerRecord
      try {
        record = await registry.lookup(peer.name, deadline - Date.now())
      } catch (error) {
        if ((error as RdmaError).code !== 'ERR_PEER_UNKNOWN') throw error
        throw new RdmaError(`Peer '${peer.name}' is gone: no agent is registered under its name (its link failed: ${peer.link?.error?.code})`, { code: 'ERR_PEER_GONE', cause: error })
      }
      const link = await this.#dial(record, { timeoutMs: Math.max(1, deadline - Date.now()) })
      if (this.#closed) {
        link.close()
        throw new RdmaError('The agent was closed', { code: 'ERR_CLOSED' })
      }
      this.#relinked(peer, link, peer.address)
      return link
    })().finally(() => { peer.relinking = undefined })
    return bounded(peer.relinking, 'reconnect', wait)
  }

  // --- transfers -------------------------------------------------------------

  /** Writes (pushes) blocks from local segments into the peer's segments. */
  write(peer: Peer, blocks: Blocks, options: TransferOptions = {}): Promise<TransferResult> {
    return this.#transfer('write', peer, blocks, options) as Promise<TransferResult>
  }

  /** Reads (pulls) blocks from the peer's segments into local segments. */
  read(peer: Peer, blocks: Blocks, options: TransferOptions = {}): Promise<TransferResult> {
    return this.#transfer('read', peer, blocks, options) as Promise<TransferResult>
  }

  /**
   * Sends the blocks of a failed write(), read() or plan.run() that did not land, after reconnecting (a restarted
   * peer gets them all unless `onRestart` says otherwise); fails with a TransferError over the original blocks.
   */
  resume(failed: TransferError, options: ResumeOptions = {}): Promise<ResumeResult> {
    return resume(this, failed, options, (op, peer, select, o) => this.#transfer(op, peer, select, o, true))
  }

  /** Sends a notification alone (ordered with those of transfers). */
  async notify(peer: Peer, message: NotificationMessage, options: WaitOptions = {}): Promise<void> {
    const wait = this.#bounded(optionalObject(options, 'options'))
    wait.timeoutMs ??= this.#stallMs // one send: no completion within the stall bound is a stall
    const payload = noticePayload(message)
    const link = await this.#linkOf(peer, wait)
    const notices = link.notices // RDMA: on the data QPs, numbered with the transfers'; TCP: on the control channel
    await bounded(notices ? notices.send(notices.take(), payload) : link.queueMessage(Promise.resolve(true), encodeNotification(payload)), 'notify', wait)
    peer.counters.notificationsSent++
  }

  /** Checks blocks once (segments, rights, bounds), coalesces and slices them; run() posts them. */
  prepare(peer: Peer, op: TransferOp, blocks: Blocks): TransferPlan {
    this.#assertPeer(peer)
    oneOf(op, 'op', ['read', 'write'] as const)
    const link = peer.link
    if (!link?.healthy) throw new RdmaError(`Peer ${peer.name} is not connected (${peer.state}); prepare after a transfer reconnected it`, { code: 'ERR_PEER_GONE' })
    let checked = checkBlocks(op, blocks, this.#table, link.remote, this.sliceBytes, link.posters.length, link.laneWeights())
    let used = segmentsUsed(checked)
    let checkedOn = link
    return new TransferPlan(peer, op, blocks, checked.bytes, async (options) => {
      const o = optionalObject(options, 'options')
      const wait = this.#bounded(o)
      const progress = progressOptions(o, this.#stallMs)
      const notify = options.notify === undefined ? undefined : noticePayload(options.notify)
      const current = await this.#linkOf(peer, wait)
      // A new link (the peer's table, its rkeys, are new), or a segment withdrawn since (perhaps registered again under its name): checked anew.
      if (current !== checkedOn || !isCurrent(checked, used)) {
        checked = recheck(checked, used, current === checkedOn, () => checkBlocks(op, blocks, this.#table, current.remote, this.sliceBytes, current.posters.length, current.laneWeights()))
        used = segmentsUsed(checked)
        checkedOn = current
      }
      return launch(this.#launcher, peer, current, checked, blocks, notify, wait, progress)
    })
  }

  /**
   * `blocks` as given, or (resume: `selected`) chosen once the link is there by the peer's incarnation (none: nothing
   * to post). On a healthy link it starts at once, in this call; a failure before posting rejects (never throws).
   */
  #transfer(op: TransferOp, peer: Peer, blocks: Blocks | ((peerAgent: string) => Blocks | undefined), options: TransferOptions, selected = false): Promise<TransferResult | undefined> {
    try {
      const o = optionalObject(options, 'options')
      const wait = this.#bounded(o)
      const progress = progressOptions(o, this.#stallMs)
      const notify = o.notify === undefined ? undefined : noticePayload(o.notify)
      const started = wait.timeoutMs === undefined ? 0 : Date.now()
      const link = this.#healthyLink(peer)
      if (link) return this.#start(op, peer, link, blocks, selected, wait, progress, notify, started)
      return this.#linkOf(peer, wait).then((fresh) => this.#start(op, peer, fresh, blocks, selected, wait, progress, notify, started))
    } catch (error) {
      return Promise.reject(error)
    }
  }

  /** Checks the blocks on `link` and launches them; the overall bound counts from `started` (reconnecting and planning included). */
  #start(op: TransferOp, peer: Peer, link: Link, blocks: Blocks | ((peerAgent: string) => Blocks | undefined), selected: boolean,
    wait: WaitOptions, progress: ProgressOptions, notify: NoticePayload | undefined, started: number): Promise<TransferResult | undefined> {
    // A caller's blocks are always checked (a function or a falsy value is refused there); resume's selector may choose none.
    const chosen = selected && typeof blocks === 'function' ? blocks(link.peerAgent) : blocks as Blocks
    if (selected && chosen === undefined) return Promise.resolve(undefined)
    const plan = checkBlocks(op, chosen as Blocks, this.#table, link.remote, this.sliceBytes, link.posters.length, link.laneWeights())
    if (wait.timeoutMs !== undefined) wait.timeoutMs = Math.max(1, wait.timeoutMs - (Date.now() - started))
    // A resume's own attempt is not resumable itself: resume() reports over the original blocks.
    return launch(this.#launcher, peer, link, plan, selected ? undefined : chosen as Blocks, notify, wait, progress)
  }

  /** The caller's wait, with the agent's default overall bound (if any) when it gives none. */
  #bounded(options: Record<string, unknown>): WaitOptions {
    const wait = waitOptions(options)
    if (this.#transferMs !== undefined) wait.timeoutMs ??= this.#transferMs
    return wait
  }

  // --- notifications and stats ----------------------------------------------

  /** Notifications from every peer, from now on, in arrival order; ends when the agent closes. */
  notifications(): AsyncIterableIterator<Notification> { return this.#feed.iterator() }

  /** Counters per peer and in total, with transfer latency percentiles. */
  stats(): AgentStats {
    const peers: AgentStats['peers'] = {}
    for (const peer of this.#peers.values()) peers[peer.id] = { ...peer.stats(), name: peer.name, state: peer.state }
    const rails = this.#railNames.map((device, i) => ({ device, bytes: this.#railBytes[i]!, failovers: this.#railFailovers[i]! }))
    return { transport: this.transport, grants: this.#transport.grants, total: totalStats([...this.#peers.values()].map((p) => p.counters)), peers, rails }
  }

  // --- closing ---------------------------------------------------------------

  /** Closes a peer's link (transfers in flight fail with ERR_CLOSED). */
  closePeer(peer: Peer): void {
    if (!(peer instanceof Peer)) throw typeError('a Peer of this agent', 'peer', peer)
    if (this.#peers.get(peer.id) !== peer) return // closed already, or another agent's
    const link = peer.link
    if (link) this.#linkFailed(peer, link, new RdmaError('The peer was closed', { code: 'ERR_CLOSED' }))
    peer.markClosed()
    this.#peers.delete(peer.id)
  }

  /**
   * Stops listening, closes every peer, deregisters the segments and closes
   * the device, at once. With metadata the returned promise settles when the
   * registration is withdrawn too (its lease revoked: peers see 'peerLeft'
   * at once rather than after the TTL), within the request bound; it never
   * rejects. Without metadata it is already settled.
   */
  close(): Promise<void> {
    if (this.#closed) return Promise.resolve()
    this.#closed = true
    const leaving = this.#registry?.close() ?? Promise.resolve()
    this.#transport.stop()
    for (const peer of [...this.#peers.values()]) this.closePeer(peer)
    this.#feed.end()
    for (const segment of [...this.#table.byName.values()]) this.#table.remove(segment)
    this.#transport.close()
    return leaving
  }

  [Symbol.dispose](): void { void this.close() }

  #assertOpen(): void { if (this.#closed) throw new RdmaError('The agent was closed', { code: 'ERR_CLOSED' }) }
}

