// An agent's peers and their links: connecting (by address, by name or by
// record through the metadata), adopting the links a handshake gives (either
// side), reading their control messages, failing them, and making a fresh one
// when the last one failed. The agent (agent.ts) owns the segments and the
// transfers, and asks this for a peer's link.
import { performance } from 'node:perf_hooks'
import { bounded } from '../cm/index.js'
import { RdmaError } from '../core/errors.js'
import { integer, object, optionalObject, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import type { ControlMessage } from './control.js'
import { decodeNotification, type NotificationFeed } from './notifications.js'
import type { Link } from './link.js'
import { Peer } from './peer.js'
import type { LocalTable } from './segments.js'
import { resync } from './resync.js'
import type { Releases } from './releases.js'
import type { Transport } from './transport.js'
import type { PeerConnectOptions, TransferAgentEvents } from './agent-options.js'
import { dialAddresses } from './dial.js'
import { isAgentName, isPeerRecord, NAME_RULE, type EtcdRegistry, type PeerLeftEvent, type PeerRecord } from './metadata/index.js'

/** What the peer links share with their agent, given once at its construction (the agent keeps the rest). */
export interface PeerLinksContext {
  readonly transport: Transport
  /** The local segments, sent to every link adopted. */
  readonly table: LocalTable
  /** The 'released' answers unregister() waits for (a link gone answers for itself). */
  readonly releases: Releases
  /** Where notifications go besides the 'notification' event (agent.notifications()). */
  readonly feed: NotificationFeed
  readonly handshakeMs: number
  /** How long after a rail failed a link is made anew (on the next transfer) to retry it (rails.ts). */
  readonly railRetryMs: number
  /** The agent's registry once create() opened it (with metadata), else undefined. */
  registry(): EtcdRegistry | undefined
  /** Whether the agent is closed (one flag, the agent's: events stop, links made meanwhile close). */
  closed(): boolean
  /** The agent's own events. */
  emit<E extends keyof TransferAgentEvents>(event: E, ...args: TransferAgentEvents[E]): void
  /** A rail failed on a link and its slices moved to the others (counted in stats()). */
  railDown(rail: number): void
}

type Address = { host: string; port: number }

/** The error of a call on a closed agent (agent.ts throws it too). */
export const agentClosed = (): RdmaError => new RdmaError('The agent was closed', { code: 'ERR_CLOSED' })

export class PeerLinks {
  readonly #context: PeerLinksContext
  readonly #peers = new Map<string, Peer>()
  /** Handshakes under way by name or record, by the incarnation dialed. */
  readonly #connecting = new Map<string, Promise<Peer>>()

  constructor(context: PeerLinksContext) { this.#context = context }

  /** Peers connected to or from the agent, by id. */
  get peers(): ReadonlyMap<string, Peer> { return this.#peers }

  /** The links of the peers connected now. */
  links(): Link[] {
    const links: Link[] = []
    for (const peer of this.#peers.values()) if (peer.link) links.push(peer.link)
    return links
  }

  /** agent.connect(): see there. */
  async connect(target: PeerConnectOptions | string | PeerRecord, options: WaitOptions): Promise<Peer> {
    if (this.#context.closed()) throw agentClosed()
    const handshakeMs = this.#context.handshakeMs
    if (typeof target === 'string' || isPeerRecord(target)) {
      const wait = waitOptions({ timeoutMs: handshakeMs, ...optionalObject(options, 'options') })
      return typeof target === 'string' ? this.#connectByName(target, wait) : this.#connectRecord(target, wait)
    }
    const o = object(target, 'options')
    if (typeof o.host !== 'string') throw typeError('an IP address', 'options.host', o.host)
    const port = integer(o.port, 'options.port', 1, 65535)
    const wait = waitOptions({ timeoutMs: o.timeoutMs ?? handshakeMs, signal: o.signal })
    const link = await this.#context.transport.connect(o.host, port, wait.timeoutMs!, wait.signal)
    return this.#adopt(link, { host: o.host, port })
  }

  #needRegistry(value: unknown): EtcdRegistry {
    const registry = this.#context.registry()
    if (!registry) throw typeError('{ host, port } (connecting by name or record needs options.metadata)', 'options', value)
    return registry
  }

  async #connectByName(name: string, wait: WaitOptions): Promise<Peer> {
    const registry = this.#needRegistry(name)
    if (!isAgentName(name)) throw typeError(NAME_RULE, 'name', name)
    // A healthy handle of that name first (after a restart the old incarnation's broken one may still be here).
    const named = [...this.#peers.values()].filter((p) => p.name === name)
    const known = named.find((p) => p.link?.healthy) ?? named[0]
    if (known) {
      known.byName = true
      await this.linkOf(known, wait)
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
    return dialAddresses(record, wait.timeoutMs ?? this.#context.handshakeMs, (address, timeoutMs) =>
      this.#context.transport.connect(address.host, address.port, timeoutMs, wait.signal, record.incarnation))
  }

  /** A peer left the cluster: the links to that incarnation fail now (not after RC retries), then listeners hear it. */
  onPeerLeft(event: PeerLeftEvent): void {
    if (this.#context.closed()) return
    for (const peer of this.#peers.values()) {
      const link = peer.link
      if (peer.id !== event.record.incarnation || !link?.healthy) continue
      this.linkFailed(peer, link, new RdmaError(`Peer '${event.record.name}' left the cluster (${event.reason === 'replaced' ? 'a new incarnation took its name' : event.reason === 'missing' ? 'its record did not come back' : 'its lease expired or it closed'})`, { code: 'ERR_PEER_GONE' }))
    }
    this.#context.emit('peerLeft', event)
  }

  /** A peer connecting to the agent: its handshake's link, once there. */
  onAccepting(accepting: Promise<Link>): void {
    // A failed handshake is the peer's problem: it is reported, never thrown.
    accepting.then((link) => {
      // Closed meanwhile (its close delivered the handshake's last message): the link goes too.
      if (this.#context.closed()) return link.close()
      this.#context.emit('peer', this.#adopt(link, undefined))
    }, (error: unknown) => { if (!this.#context.closed()) this.#context.emit('handshakeError', error as Error) })
  }

  #adopt(link: Link, address: Address | undefined): Peer {
    if (this.#context.closed()) {
      link.close()
      throw agentClosed()
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
    resync(link, this.#context.table)
    link.onRailDown = (rail) => this.#context.railDown(rail)
    const owner = peer
    link.listen((message) => this.#onMessage(owner, link, message), (error) => this.linkFailed(owner, link, error), (message) => this.#notified(owner, message))
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
      case 'released': return this.#context.releases.released(link, message.name, message.v)
      default: throw new RdmaError(`Unexpected control message ${JSON.stringify(message).slice(0, 100)}`, { code: 'ERR_TRANSFER_PROTOCOL' })
    }
  }

  /** A notification from `peer` (its data, if any, is in place). */
  #notified(peer: Peer, message: string | Buffer): void {
    peer.counters.notificationsReceived++
    const notification = { peer, message }
    this.#context.emit('notification', notification)
    this.#context.feed.push(notification)
  }

  /** Fails `link` (the peer's, or one it had) and every run on it, once; listeners hear 'peerLost' unless the agent is closed. */
  linkFailed(peer: Peer, link: Link, error: Error): void {
    if (link.error) return
    this.#context.releases.linkGone(link)
    const coded = error instanceof RdmaError ? error : new RdmaError(error.message, { code: 'ECONNRESET', cause: error })
    // Each run fails once closing the QPs has delivered the completions already in the CQ (they count as landed).
    for (const run of link.runs) run.linkFailed(coded, 'the link to the peer failed')
    link.fail(coded)
    if (!this.#context.closed()) this.#context.emit('peerLost', { peer, error: coded })
  }

  /** Throws ERR_INVALID_ARG_TYPE unless `peer` is a Peer of this agent (a closed one is no longer). */
  assertPeer(peer: Peer): void {
    if (!(peer instanceof Peer) || this.#peers.get(peer.id) !== peer) throw typeError('a Peer of this agent', 'peer', peer)
  }

  /**
   * The peer's link, fresh if the last one failed: a peer reached by name is
   * looked up again (a restarted one is reached at its new incarnation), one
   * reached by address is dialed there again; one that connected to this
   * agent fails fast, unless the metadata knows its name.
   */
  async linkOf(peer: Peer, wait: WaitOptions): Promise<Link> {
    const healthy = this.healthyLink(peer)
    if (healthy) return healthy
    const address = peer.address
    const registry = this.#context.registry()
    if (registry && (peer.byName || (!address && isAgentName(peer.name)))) return this.#relinkByName(peer, registry, wait)
    if (!address) {
      throw new RdmaError(`The link to peer ${peer.name} failed (${peer.link?.error?.code}); it connected to this agent, so it must connect again`, { code: 'ERR_PEER_GONE', cause: peer.link?.error })
    }
    // One attempt for every caller, bounded by the handshake bound alone; each caller waits within its own bound.
    peer.relinking ??= this.#context.transport.connect(address.host, address.port, this.#context.handshakeMs).then((link) => {
      peer.relinking = undefined
      this.#relinked(peer, link, address)
      return link
    }, (error: unknown) => {
      peer.relinking = undefined
      throw new RdmaError(`Cannot reconnect to peer ${peer.name} at ${address.host}:${address.port}: ${(error as Error).message}`, { code: (error as RdmaError).code ?? 'ECONNREFUSED', cause: error })
    })
    return bounded(peer.relinking, 'reconnect', wait)
  }

  /** The peer's link if it is healthy now, else undefined (linkOf makes a fresh one); throws what linkOf rejects with first. */
  healthyLink(peer: Peer): Link | undefined {
    if (this.#context.closed()) throw agentClosed()
    this.assertPeer(peer)
    if (peer.state === 'closed') throw new RdmaError('The peer was closed', { code: 'ERR_CLOSED' })
    const link = peer.link
    if (!link?.healthy) return undefined
    // A rail failed on it a while ago and nothing runs on it: made anew (every rail again), if this side can dial the peer.
    if (link.railDownAt > 0 && link.runs.size === 0 && performance.now() - link.railDownAt >= this.#context.railRetryMs && (peer.address || peer.byName)) {
      this.#context.releases.linkGone(link)
      link.fail(new RdmaError('The link is made anew to retry a rail that failed', { code: 'ECONNRESET' }))
      return undefined
    }
    return link
  }

  /** A new link under an old handle; another agent (a restarted process) answering keeps the handle with its new identity. */
  #relinked(peer: Peer, link: Link, address: Address | undefined): void {
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
      const deadline = Date.now() + this.#context.handshakeMs
      let record: PeerRecord
      try {
        record = await registry.lookup(peer.name, deadline - Date.now())
      } catch (error) {
        if ((error as RdmaError).code !== 'ERR_PEER_UNKNOWN') throw error
        throw new RdmaError(`Peer '${peer.name}' is gone: no agent is registered under its name (its link failed: ${peer.link?.error?.code})`, { code: 'ERR_PEER_GONE', cause: error })
      }
      const link = await this.#dial(record, { timeoutMs: Math.max(1, deadline - Date.now()) })
      if (this.#context.closed()) {
        link.close()
        throw agentClosed()
      }
      this.#relinked(peer, link, peer.address)
      return link
    })().finally(() => { peer.relinking = undefined })
    return bounded(peer.relinking, 'reconnect', wait)
  }

  /** agent.closePeer(): its link fails with ERR_CLOSED (transfers in flight with it), and the handle leaves the peers. */
  close(peer: Peer): void {
    if (!(peer instanceof Peer)) throw typeError('a Peer of this agent', 'peer', peer)
    if (this.#peers.get(peer.id) !== peer) return // closed already, or another agent's
    const link = peer.link
    if (link) this.linkFailed(peer, link, new RdmaError('The peer was closed', { code: 'ERR_CLOSED' }))
    peer.markClosed()
    this.#peers.delete(peer.id)
  }
}
