// The transfer agent: registers segments, listens for and connects to peers,
// and moves blocks between its segments and theirs (write = push, read =
// pull), with notifications that reach the peer after the data. Its peers and
// their links (connecting, relinking, failing) are peer-links.ts's.
import { EventEmitter } from 'node:events'
import { randomUUID } from 'node:crypto'
import { bounded } from '../cm/index.js'
import type { Device } from '../verbs/device.js'
import { RdmaError } from '../core/errors.js'
import type { RegisterableMemory } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import { integer, object, oneOf, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { encodeNotification, noticePayload, NotificationFeed, type NoticePayload } from './notifications.js'
import type { Link } from './link.js'
import { agentSettings, chooseTransport, progressOptions, type ProgressOptions } from './agent-settings.js'
import { Peer } from './peer.js'
import { checkBlocks, isCurrent, recheck, segmentsUsed, type Blocks, type TransferOp } from './plan.js'
import type { TransferResult } from './run.js'
import { launch, type Launcher } from './launch.js'
import { TransferPlan } from './transfer-plan.js'
import { LocalTable, SEGMENT_RIGHTS, type Segment, type SegmentMemory } from './segments.js'
import { announce } from './resync.js'
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
import { agentClosed, PeerLinks } from './peer-links.js'
import { EtcdRegistry, metadataSettings, isAgentName, NAME_RULE, type MetadataState, type PeerRecord } from './metadata/index.js'

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
  readonly #transferMs: number | undefined
  readonly #stallMs: number
  readonly #table = new LocalTable()
  readonly #feed = new NotificationFeed()
  readonly #releases = new Releases()
  /** The peers and their links: connecting, adopting, failing, relinking (peer-links.ts). */
  readonly #peerLinks: PeerLinks
  #registry: EtcdRegistry | undefined
  #closed = false
  /** RDMA: the rails' device names (rails.ts), and the bytes each moved (confirmed by completions). */
  readonly #railNames: string[]
  readonly #railBytes: number[]
  /** Times each rail failed on a link and its slices moved to the others. */
  readonly #railFailovers: number[]
  /** What every transfer's launch needs of this agent, made once. */
  readonly #launcher: Launcher = {
    linkFailed: (peer, link, error) => this.#peerLinks.linkFailed(peer, link, error),
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
    const links = {
      agent: this.id, name: this.name, qps: this.qpsPerPeer, queueDepth: settings.queueDepth, batchWrs: settings.batchWrs, pollMode: settings.pollMode, admission: settings.admission,
      table: async (peerName: string, grants: LinkGrants) => {
        const version = this.#table.version
        return { entries: await this.#table.entriesFor(peerName, (s, name) => grants.grant(s, name)), version }
      },
    }
    this.#transport = device ? new RdmaTransport(device, links, settings.ackTimeout, settings.handshakeMs, rails) : new TcpTransport(links, settings.handshakeMs)
    this.#railNames = device ? [device.name, ...rails.map((d) => d.name)] : []
    this.#railBytes = new Array<number>(this.#railNames.length).fill(0)
    this.#railFailovers = new Array<number>(this.#railNames.length).fill(0)
    this.transport = kind
    this.device = this.#transport.device
    this.pd = this.#transport.pd
    this.#peerLinks = new PeerLinks({
      transport: this.#transport, table: this.#table, releases: this.#releases, feed: this.#feed,
      handshakeMs: settings.handshakeMs, railRetryMs: settings.railRetryMs,
      registry: () => this.#registry,
      closed: () => this.#closed,
      emit: (event, ...args) => { this.emit(event, ...args) },
      railDown: (rail) => { this.#railFailovers[rail] = this.#railFailovers[rail]! + 1 },
    })
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
      await agent.#transport.listen(o.host, port, (accepting) => agent!.#peerLinks.onAccepting(accepting))
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
      left: (event) => this.#peerLinks.onPeerLeft(event),
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
  get peers(): ReadonlyMap<string, Peer> { return this.#peerLinks.peers }

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
    for (const link of this.#peerLinks.links()) announce(link, segment, this.#table.version)
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
    for (const link of this.#peerLinks.links()) if (link.peerName === peerName) announce(link, s, this.#table.version)
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
    for (const link of this.#peerLinks.links()) if (link.peerName === peerName) void link.sendTable(() => [{ t: 'del', v, name: s.name }])
  }

  /** A registered segment granted per peer (register's `peers`). */
  #perPeer(segment: Segment | string): Segment {
    const s = this.#table.resolve(segment)
    if (!s.grants) throw new RdmaError(`Segment '${s.name}' is shared by every peer through its region's key: register it with options.peers to grant and revoke it per peer`, { code: 'ERR_SEGMENT_SHARED' })
    return s
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
    const links = this.#peerLinks.links()
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

  // --- peers (peer-links.ts) -------------------------------------------------

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
  connect(target: PeerConnectOptions | string | PeerRecord, options: WaitOptions = {}): Promise<Peer> {
    return this.#peerLinks.connect(target, options)
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
    const link = await this.#peerLinks.linkOf(peer, wait)
    const notices = link.notices // RDMA: on the data QPs, numbered with the transfers'; TCP: on the control channel
    await bounded(notices ? notices.send(notices.take(), payload) : link.queueMessage(Promise.resolve(true), encodeNotification(payload)), 'notify', wait)
    peer.counters.notificationsSent++
  }

  /** Checks blocks once (segments, rights, bounds), coalesces and slices them; run() posts them. */
  prepare(peer: Peer, op: TransferOp, blocks: Blocks): TransferPlan {
    this.#peerLinks.assertPeer(peer)
    oneOf(op, 'op', ['read', 'write'] as const)
    const link = peer.link
    if (!link?.healthy) throw new RdmaError(`Peer ${peer.name} is not connected (${peer.state}); prepare after a transfer reconnected it`, { code: 'ERR_PEER_GONE' })
    let checked = checkBlocks(op, blocks, this.#table, link.remote, this.sliceBytes, link.posters.length, link.laneWeights())
    let used = segmentsUsed(checked)
    let checkedOn = link
    // On `current` (the link now): checked anew if it is a new link (the peer's table, its rkeys, are new) or a segment was withdrawn since (perhaps registered again under its name).
    const start = (current: Link, wait: WaitOptions, progress: ProgressOptions, notify: NoticePayload | undefined): Promise<TransferResult> => {
      if (current !== checkedOn || !isCurrent(checked, used)) {
        checked = recheck(checked, used, current === checkedOn, () => checkBlocks(op, blocks, this.#table, current.remote, this.sliceBytes, current.posters.length, current.laneWeights()))
        used = segmentsUsed(checked)
        checkedOn = current
      }
      return launch(this.#launcher, peer, current, checked, blocks, notify, wait, progress)
    }
    // As write() and read(): on a healthy link it starts in this call; a failure before posting rejects (never throws).
    return new TransferPlan(peer, op, blocks, checked.bytes, (options) => this.#begin(peer, options, start))
  }

  /**
   * `blocks` as given, or (resume: `selected`) chosen once the link is there by the peer's incarnation (none: nothing
   * to post). On a healthy link it starts at once, in this call; a failure before posting rejects (never throws).
   */
  #transfer(op: TransferOp, peer: Peer, blocks: Blocks | ((peerAgent: string) => Blocks | undefined), options: TransferOptions, selected = false): Promise<TransferResult | undefined> {
    return this.#begin(peer, options, (link, wait, progress, notify, started) => this.#start(op, peer, link, blocks, selected, wait, progress, notify, started))
  }

  /**
   * What write(), read() and a prepared plan's run() share: the options
   * checked, then `start` on the peer's link: in this call on a healthy link,
   * else once it is reconnected. `started`: when the overall bound began
   * (0 without one). A failure before posting rejects (never throws).
   */
  #begin<T>(peer: Peer, options: TransferOptions, start: (link: Link, wait: WaitOptions, progress: ProgressOptions, notify: NoticePayload | undefined, started: number) => Promise<T>): Promise<T> {
    try {
      const o = optionalObject(options, 'options')
      const wait = this.#bounded(o)
      const progress = progressOptions(o, this.#stallMs)
      const notify = o.notify === undefined ? undefined : noticePayload(o.notify)
      const started = wait.timeoutMs === undefined ? 0 : Date.now()
      const link = this.#peerLinks.healthyLink(peer)
      if (link) return start(link, wait, progress, notify, started)
      return this.#peerLinks.linkOf(peer, wait).then((fresh) => start(fresh, wait, progress, notify, started))
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
    for (const peer of this.#peerLinks.peers.values()) peers[peer.id] = { ...peer.stats(), name: peer.name, state: peer.state }
    const rails = this.#railNames.map((device, i) => ({ device, bytes: this.#railBytes[i]!, failovers: this.#railFailovers[i]! }))
    return { transport: this.transport, grants: this.#transport.grants, total: totalStats([...this.#peerLinks.peers.values()].map((p) => p.counters)), peers, rails }
  }

  // --- closing ---------------------------------------------------------------

  /** Closes a peer's link (transfers in flight fail with ERR_CLOSED). */
  closePeer(peer: Peer): void { this.#peerLinks.close(peer) }

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
    for (const peer of [...this.#peerLinks.peers.values()]) this.closePeer(peer)
    this.#feed.end()
    for (const segment of [...this.#table.byName.values()]) this.#table.remove(segment)
    this.#transport.close()
    return leaving
  }

  [Symbol.dispose](): void { void this.close() }

  #assertOpen(): void { if (this.#closed) throw agentClosed() }
}

