// A link to a peer: a control channel plus data lanes. `Link` is the part
// both transports share (the ordered outbox of notifications, table changes,
// failure); `RdmaLink` is the rdma_cm control connection plus the data QPs
// (plain RC QPs on a CQ of their own, connected with endpoints exchanged over
// the control channel); the TCP link is in tcp/link.ts. A link is used until
// it fails; then it is torn down as a whole and never reused: the next
// transfer gets a fresh link (fresh QPs, or a fresh socket).
import { performance } from 'node:perf_hooks'
import { connect, type Connection, type ConnectionRequest } from '../cm/index.js'
import { RdmaError } from '../core/errors.js'
import type { CompletionQueue } from '../verbs/completion-queue.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { QpEndpoint } from '../verbs/queue-pair-options.js'
import { QpPoster, type Lane } from './poster.js'
import { QpLane } from './qp-lane.js'
import { RemoteTable, type SegmentEntry } from './segments.js'
import { KeyGrants, WindowGrants, type LinkGrants } from './grants.js'
import { CONNECT_TAG, ControlInbox, PROTOCOL, protocolError, STALE_TAG, staleError, wantedIncarnation, receiveTable, sendTable, type AddMessage, type ControlChannel, type ControlMessage, type HelloMessage } from './control.js'
import type { TransferRun } from './run.js'
import { StallWatch } from './stall-watch.js'
import { NOTICE_RECEIVES, NoticeInbox } from './notices.js'
import { NoticeSender } from './notice-sender.js'
import type { AgentLinkSettings } from './transport.js'
import { MAX_RAILS, RailMeter, railOf } from './rails.js'
import { ConnectorGate, ListenerGate, Refusal, type ProofMessage } from './admission.js'

/** An RDMA link's settings: the agent's, plus the PD and the data QPs' ACK timeout. */
export interface LinkSettings extends AgentLinkSettings {
  pd: ProtectionDomain
  /** The PDs of the agent's other rails (rails.ts), in rail order; empty with one rail. */
  railPds: readonly ProtectionDomain[]
  /** Per-peer grants through memory windows (the device has them); else the region's key. */
  windows: boolean
  /** The data QPs' ACK timeout exponent (4.096 µs × 2^n), on both ends of each QP. */
  ackTimeout: number
}

/** A message waiting for its turn: `go` is undefined until its data is placed (or failed). */
interface Outgoing { go: boolean | undefined; json: string; message: ControlMessage; resolve: () => void; reject: (error: Error) => void }
/** Control sends in flight per link. */
const SENDING = 8
/** Bytes of JSON packed into one control message (a message holds 4096). */
const MESSAGE_BYTES = 3500

/** Most data QPs a peer may ask for. */
export const MAX_QPS = 16

export class Link {
  readonly posters: QpPoster[]
  /** Rails of this link (rails.ts): their measured rates and which are down; undefined with one rail. */
  meter: RailMeter | undefined
  /** Lanes per rail (all lanes with one rail). */
  perRail: number
  /**
   * The rail the control channel runs on (rails.ts): the rail of the address
   * dialed, 0 unless rail 0's address did not answer. Its failure is the link's.
   */
  controlRail = 0
  readonly runs = new Set<TransferRun>()
  /** The stall bound of the runs, one timer for all of them. */
  readonly stalls = new StallWatch(this.runs)
  error: RdmaError | undefined
  /** The local table as sent in the handshake (the agent sends what changed since). */
  sentTable: { entries: SegmentEntry[]; version: number } = { entries: [], version: 0 }
  readonly #outbox: Outgoing[] = []
  #sending = 0
  #closed = false
  #onFailure: ((error: Error) => void) | undefined
  /** Table changes in the order made (a grant's keys are bound before its entry goes). */
  #tableChain: Promise<void> = Promise.resolve()

  constructor(readonly conn: ControlChannel, readonly inbox: ControlInbox, readonly lanes: readonly Lane[], readonly remote: RemoteTable,
    /** The per-peer segments granted on this link (grants.ts). */
    readonly grants: LinkGrants,
    readonly peerAgent: string, readonly peerName: string, batchWrs: number, readonly closeData: () => void = () => undefined) {
    this.posters = lanes.map((lane, i) => new QpPoster(lane, i, batchWrs))
    this.perRail = lanes.length
  }

  /** With several rails: each lane's share of a transfer's bytes (its rail's measured share); else undefined (equal). */
  laneWeights(): Float64Array | undefined { return this.meter?.laneWeights(this.perRail) }

  /** When a rail last failed (performance.now()), 0 if none did: the agent makes the link anew later to retry it. */
  railDownAt = 0
  /** Told of each rail that fails (stats().rails' failovers). */
  onRailDown: ((rail: number, error: Error) => void) | undefined

  /**
   * A lane of rail `rail` went into the error state. The control channel's
   * rail (controlRail): its failure is the link's (false), as is that of the
   * last rail up. Another rail is marked down (shares 0 from now on), and
   * every run moves the slices its lanes had not confirmed to the lanes still
   * up (true).
   */
  railFailed(rail: number, error: Error): boolean {
    const meter = this.meter
    if (meter === undefined || rail === this.controlRail || !this.healthy) return false
    if (meter.isDown(rail)) return true
    if (meter.up <= 1) return false
    meter.markDown(rail)
    this.railDownAt = performance.now()
    this.onRailDown?.(rail, error)
    const first = rail * this.perRail
    for (const run of this.runs) run.railDown(first, first + this.perRail)
    for (const run of this.runs) this.wakeUp(run)
    return true
  }

  /** The lanes of the rails still up take `run`'s slices put back (a rail failed). */
  wakeUp(run: TransferRun): void {
    for (const poster of this.posters) if (!this.meter?.isDown(poster.lane.rail)) poster.wake(run)
  }

  /** Resolves once every batch posted on this link before now has settled (a peer's withdrawal waits for it). */
  drained(): Promise<void> { return Promise.all(this.posters.map((poster) => poster.drained())).then(() => undefined) }

  get healthy(): boolean { return this.error === undefined && !this.#closed }

  /** RDMA: notifications ride on the data QPs (notices.ts); TCP: undefined, they go on the control channel. */
  get notices(): NoticeSender | undefined { return undefined }

  /**
   * Sends `message` once `ready` resolves true (drops it on false), after
   * every message queued before it: notifications go out in the order they
   * were queued. Messages ready together travel in one SEND (a 'm' list), and
   * at most SENDING sends are in flight: a burst of notifications costs a few
   * messages, not one round trip each. Resolves when the peer has it.
   */
  queueMessage(ready: Promise<boolean>, message: ControlMessage): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const item: Outgoing = { go: undefined, json: JSON.stringify(message), message, resolve, reject }
      this.#outbox.push(item)
      ready.then((go) => { item.go = go; this.#flush() }, () => { item.go = false; this.#flush() })
    })
  }

  #flush(): void {
    while (this.#sending < SENDING && this.#outbox.length > 0) {
      const batch: Outgoing[] = []
      let size = 0
      while (this.#outbox.length > 0 && this.#outbox[0]!.go !== undefined) {
        const item = this.#outbox[0]!
        if (!item.go) { this.#outbox.shift(); item.resolve(); continue }
        if (batch.length > 0 && size + item.json.length + 1 > MESSAGE_BYTES) break
        this.#outbox.shift()
        batch.push(item)
        size += item.json.length + 1
      }
      if (batch.length === 0) return // the head waits for its data
      const message: ControlMessage = batch.length === 1 ? batch[0]!.message : { t: 'm', list: batch.map((b) => b.message) }
      this.#sending++
      this.conn.sendJson(message).then(() => {
        this.#sending--
        for (const b of batch) b.resolve()
        this.#flush()
      }, (error: Error) => {
        this.#sending--
        for (const b of batch) b.reject(error)
        this.#flush()
      })
    }
  }

  /**
   * Sends a table change. One that cannot be sent would leave the peer with a
   * stale table on a link that looks healthy: the link fails instead
   * (ERR_CONTROL_SEND, through listen()'s onFailure once listening), and the
   * next transfer either way reconnects and trades the tables anew.
   */
  broadcast(message: ControlMessage): void {
    if (!this.healthy) return
    this.conn.sendJson(message).catch((error: unknown) => {
      if (!this.healthy) return
      const failure = new RdmaError(`A segment-table change could not be sent to the peer (${(error as Error)?.message}); the link is failed, so that the next transfer reconnects with the tables anew`,
        { code: 'ERR_CONTROL_SEND', cause: error })
      if (this.#onFailure) this.#onFailure(failure)
      else this.fail(failure)
    })
  }

  /**
   * Sends table changes after those queued before, once `make` has made them
   * (it may bind a grant first). A grant that cannot be made fails the link,
   * as a change that cannot be sent does (broadcast()).
   */
  sendTable(make: () => ControlMessage[] | Promise<ControlMessage[]>): Promise<void> {
    const step = this.#tableChain.then(async () => {
      if (!this.healthy) return
      let messages: ControlMessage[]
      try {
        messages = await make()
      } catch (error) {
        if (!this.healthy) return
        const failure = new RdmaError(`A segment grant could not be made for the peer (${(error as Error)?.message}); the link is failed, so that the next transfer reconnects with the tables anew`,
          { code: 'ERR_CONTROL_SEND', cause: error })
        if (this.#onFailure) this.#onFailure(failure)
        else this.fail(failure)
        return
      }
      for (const message of messages) this.broadcast(message)
    })
    this.#tableChain = step
    return step
  }

  /**
   * Starts taking control messages after the handshake, and (RDMA) the
   * notifications that ride on the data QPs; TCP's come as 'n' messages.
   */
  listen(onMessage: (message: ControlMessage) => void, onFailure: (error: Error) => void, _onNotice?: (message: string | Buffer) => void): void {
    this.#onFailure = onFailure
    this.conn.on('disconnected', () => onFailure(new RdmaError('The peer disconnected (its process or link is gone)', { code: 'ECONNRESET' })))
    this.inbox.listen(onMessage, onFailure)
  }

  /**
   * Marks the link failed: its queued work is dropped, the lanes are closed
   * (RDMA: the device is then done with every buffer the QPs named; requests
   * in flight are rejected), and the peer's segments are withdrawn.
   */
  fail(error: RdmaError): void {
    if (this.error) return
    this.error = error
    this.notices?.fail(error)
    for (const poster of this.posters) poster.clear()
    this.remote.clear()
    this.close()
  }

  close(): void {
    if (this.#closed) return
    this.#closed = true
    this.error ??= new RdmaError('The link was closed', { code: 'ERR_CLOSED' })
    this.grants.close() // the peer's grants go first: its rkeys are refused from here on
    for (const lane of this.lanes) lane.close()
    try { this.closeData() } catch { /* closed with the device */ }
    this.conn.close()
  }
}

/** An RDMA link: the rdma_cm connection's QP carries the control messages, RC QPs on one CQ the data and the notifications. */
export class RdmaLink extends Link {
  readonly #notices: NoticeSender

  /**
   * `controlRail`: the rail of the control connection (`conn`), in the agent's
   * rail order; `unreachable`: rails whose QPs could not be connected (no route
   * to the peer's address on them, e.g. their wire down): down from the start.
   */
  constructor(conn: Connection, inbox: ControlInbox, readonly data: DataQps, remote: RemoteTable,
    peerAgent: string, peerName: string, batchWrs: number, controlRail = 0, readonly unreachable: readonly number[] = []) {
    super(conn, inbox, data.qps.map((qp, i) => new QpLane(qp, i, railOf(i, data.perRail))), remote, data.grants, peerAgent, peerName, batchWrs, () => closeData(data))
    this.perRail = data.perRail
    const rails = data.qps.length / data.perRail
    this.controlRail = controlRail
    // Notices alone go on the control rail's first QP (rail 0's if the link has no lane there), messages of writes preferably on its lanes too.
    const first = controlRail < rails ? controlRail * data.perRail : 0
    this.#notices = new NoticeSender(this.posters[first]!, this.lanes as readonly QpLane[], first, first + data.perRail)
    if (rails > 1) {
      this.meter = new RailMeter(rails)
      // A QP of another rail than the control channel's in the error state (its notice receives flushed): that rail failed, not the link.
      data.notices.onFlushed = (qp, error) => this.railFailed(railOf(data.qps.indexOf(qp), data.perRail), error)
      for (const rail of unreachable) this.meter.markDown(rail)
      if (unreachable.length > 0) this.railDownAt = performance.now() // retried as a failed rail is (railRetryMs)
    }
  }

  /** The rails this link moves data on. */
  get rails(): number { return this.data.qps.length / this.data.perRail }

  override get notices(): NoticeSender { return this.#notices }
  get qps(): readonly QueuePair[] { return this.data.qps }
  get cq(): CompletionQueue { return this.data.cqs[0]! }

  override listen(onMessage: (message: ControlMessage) => void, onFailure: (error: Error) => void, onNotice: (message: string | Buffer) => void): void {
    super.listen(onMessage, onFailure, onNotice)
    this.data.notices.listen(onNotice, onFailure)
  }
}

/**
 * A link's data QPs (`perRail` on each rail, rail by rail), a CQ per rail
 * they share, the receiving half of their notices, and the peer's grants on them.
 */
type DataQps = { cqs: CompletionQueue[]; qps: QueuePair[]; perRail: number; notices: NoticeInbox; grants: LinkGrants }

/** Closes what dataQps() opened: grants, then QPs (their receives are flushed before the buffers go). */
function closeData(data: Partial<DataQps>): void {
  data.grants?.close()
  for (const qp of data.qps ?? []) qp.close()
  for (const cq of data.cqs ?? []) cq.close()
  data.notices?.close()
}

/** `perRail` QPs on each of the first `rails` rails (each on its rail's device, PD and a CQ of its own); notices and grants come in finishData(). */
function dataQps(settings: LinkSettings, perRail: number, rails: number): Partial<DataQps> {
  const pds = [settings.pd, ...settings.railPds].slice(0, rails)
  const data: Partial<DataQps> = { cqs: [], qps: [], perRail }
  try {
    for (const pd of pds) {
      // Each QP: its slices and one notice in flight (qp-lane.ts), and the notices' receives.
      const cq = pd.device.createCq({ entries: perRail * (settings.queueDepth + 1 + NOTICE_RECEIVES) + 16, pollMode: settings.pollMode })
      data.cqs!.push(cq)
      for (let i = 0; i < perRail; i++) data.qps!.push(pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: settings.queueDepth + 1, maxRecvWr: NOTICE_RECEIVES }))
    }
  } catch (error) {
    closeData(data)
    throw error
  }
  return data
}

/** Keeps the first `rails` rails of `data` (the peer has no more), then opens the notices' receives and the grants over its QPs. */
function finishData(settings: LinkSettings, data: Partial<DataQps>, rails: number): DataQps {
  const keep = rails * data.perRail!
  for (const qp of data.qps!.splice(keep)) qp.close()
  for (const cq of data.cqs!.splice(rails)) cq.close()
  data.notices = new NoticeInbox(data.qps!)
  data.grants = settings.windows ? new WindowGrants(settings.pd, data.qps!, data.perRail) : new KeyGrants()
  return data as DataQps
}

/** No route to the peer's address on a QP's device (its wire down, its address gone): that rail is unreachable, not the link broken. */
const NO_ROUTE = new Set(['ENETUNREACH', 'EHOSTUNREACH', 'EADDRNOTAVAIL'])

/**
 * Connects the data QPs to the peer's endpoints. A rail other than the
 * control channel's whose QPs find no route to the peer (ibv_modify_qp to
 * RTR: ENETUNREACH when its wire is down) is left unconnected and returned:
 * the link starts with it down (RdmaLink), its lanes get no slices. Any other
 * failure is the handshake's.
 */
async function connectQps(data: DataQps, endpoints: readonly QpEndpoint[], controlRail: number, ackTimeout: number): Promise<number[]> {
  const unreachable: number[] = []
  for (let i = 0; i < data.qps.length; i++) {
    const rail = railOf(i, data.perRail)
    try { // every QP of an unreachable rail is tried too: each stays in INIT (its notice receives can be posted)
      await data.qps[i]!.connect(endpoints[i]!, { timeout: ackTimeout })
    } catch (error) {
      if (rail === controlRail || !NO_ROUTE.has((error as RdmaError).code ?? '') || data.qps.length === data.perRail) throw error
      if (!unreachable.includes(rail)) unreachable.push(rail)
    }
  }
  // The last rail standing is the link: none reachable but the control channel's is fine; none at all is not.
  if (unreachable.length * data.perRail >= data.qps.length) throw new RdmaError('No rail reaches the peer', { code: 'ENETUNREACH' })
  return unreachable
}

/** The rails a hello offers (`perRail` QPs each; one rail when it does not say). */
function railsOffered(message: HelloMessage): { perRail: number; rails: number } {
  const perRail = message.perRail ?? message.qps.length
  if (!Number.isInteger(perRail) || perRail < 1 || perRail > MAX_QPS || message.qps.length % perRail !== 0 || message.qps.length / perRail > MAX_RAILS) {
    throw protocolError('The peer sent a malformed handshake (its rails)')
  }
  return { perRail, rails: message.qps.length / perRail }
}

function checkHello(message: HelloMessage, expected: number | undefined): void {
  if (message.p !== PROTOCOL) throw protocolError(`The peer speaks transfer protocol ${message.p}, this agent ${PROTOCOL}`)
  if (typeof message.agent !== 'string' || !Array.isArray(message.qps) || message.qps.length < 1 || message.qps.length > MAX_QPS * MAX_RAILS) {
    throw protocolError('The peer sent a malformed handshake')
  }
  const { perRail } = railsOffered(message)
  if (expected !== undefined && perRail !== expected) throw protocolError(`The peer offered ${perRail} QPs for ${expected}`)
}

/**
 * Exchanges the tables (both ways at once: neither side waits on the other's
 * receives). The peer `peerName` gets the shared segments and those granted
 * to it, with this link's keys (`grants` binds them); its table names a key
 * per lane for each of its grants.
 */
export async function exchangeTables(conn: ControlChannel, inbox: ControlInbox, settings: Pick<LinkSettings, 'table'>, remote: RemoteTable, timeoutMs: number,
  peerName: string, grants: LinkGrants, lanes: number, perRail = lanes): Promise<{ entries: SegmentEntry[]; version: number }> {
  const [sent] = await Promise.all([
    settings.table(peerName, grants).then(async (table) => {
      await sendTable(conn, table.entries, table.version, timeoutMs)
      return table
    }),
    receiveTable(inbox, timeoutMs, (m: AddMessage) => remote.add(m.seg, m.v, lanes, perRail)),
  ])
  return sent
}

/** A handshake step failed: a flushed receive or send means the peer closed the connection. */
function handshakeError(error: unknown): unknown {
  const code = (error as RdmaError)?.code
  if (code !== 'WR_FLUSH_ERR' && code !== 'ERR_QP_STATE') return error
  return new RdmaError('The peer closed the connection during the handshake', { code: 'ECONNRESET', cause: error })
}

/**
 * The handshake on a new control connection, on either side: `greet` opens the
 * data QPs (through `open`, so that a failure closes them), trades hellos,
 * connects the QPs and returns the peer's hello; then the tables are exchanged
 * and the link is built. A failure closes all that was opened.
 */
async function handshake(conn: Connection, settings: LinkSettings, controlRail: number, unreachable: number[], left: () => number,
  greet: (inbox: ControlInbox, open: (perRail: number, rails: number) => Partial<DataQps>, finish: (rails: number) => DataQps) => Promise<HelloMessage>): Promise<RdmaLink> {
  let data: Partial<DataQps> | undefined
  let done: DataQps | undefined
  try {
    // Receives for everything the peer may send are posted before this side first sends.
    const inbox = new ControlInbox(conn)
    const peer = await greet(inbox, (perRail, rails) => (data = dataQps(settings, perRail, rails)), (rails) => (done = finishData(settings, data!, rails)))
    const remote = new RemoteTable()
    const sent = await exchangeTables(conn, inbox, settings, remote, left(), String(peer.name), done!.grants, done!.qps.length, done!.perRail)
    const link = new RdmaLink(conn, inbox, done!, remote, peer.agent, String(peer.name), settings.batchWrs, controlRail, unreachable) // greet opened the QPs
    link.sentTable = sent
    return link
  } catch (error) {
    if (data) closeData(data)
    conn.close()
    throw handshakeError(error)
  }
}

/**
 * Connects to the agent at host:port and sets up a link (the connecting side).
 * With `incarnation`, only that incarnation of the agent will do: another one
 * listening there (a restarted process on the same port) refuses the request,
 * and the connect fails with ERR_STALE_PEER.
 */
export async function connectLink(settings: LinkSettings, host: string, port: number, timeoutMs: number, signal?: AbortSignal, incarnation?: string): Promise<RdmaLink> {
  const deadline = Date.now() + timeoutMs
  const left = () => Math.max(1, deadline - Date.now())
  const privateData = incarnation === undefined ? CONNECT_TAG : Buffer.concat([CONNECT_TAG, Buffer.from(incarnation)])
  let conn: Connection
  try {
    // Every rail's PD: the connection takes the one of the device the address resolves to (its rail carries the control channel).
    conn = await connect({ host, port, pd: [settings.pd, ...settings.railPds], privateData, receiveJson: true, timeoutMs, ...(signal ? { signal } : {}) })
  } catch (error) {
    const data = (error as RdmaError).privateData
    if (incarnation !== undefined && (error as RdmaError).code === 'ECONNREFUSED' && data?.subarray(0, STALE_TAG.length).equals(STALE_TAG)) {
      throw staleError(host, port, incarnation, wantedIncarnation(data, STALE_TAG.length), error)
    }
    throw error
  }
  const gate = new ConnectorGate(settings.admission, 'rdma', settings)
  const controlRail = Math.max(0, [settings.pd, ...settings.railPds].indexOf(conn.pd))
  const unreachable: number[] = []
  return handshake(conn, settings, controlRail, unreachable, left, async (inbox, open, finish) => {
    // Every rail's QPs offered (perRail says how they are laid out; a peer that does not know rails takes rail 0's only).
    const rails = 1 + settings.railPds.length
    const opened = open(settings.qps, rails)
    await conn.sendJson({ t: 'hello', p: PROTOCOL, agent: settings.agent, name: settings.name, qps: opened.qps!.map((qp) => qp.endpoint()),
      ...(rails > 1 ? { perRail: settings.qps } : {}), ...gate.hello() } satisfies HelloMessage, { timeoutMs: left() })
    const welcome = await inbox.expect<HelloMessage>('welcome', left())
    checkHello(welcome, settings.qps)
    if (welcome.qps.length > opened.qps!.length) throw protocolError(`The peer answered ${welcome.qps.length} QPs for ${opened.qps!.length}`)
    const data = finish(welcome.qps.length / settings.qps)
    // A peer that did not check the incarnation itself (it answered anyway): refused here.
    if (incarnation !== undefined && welcome.agent !== incarnation) throw staleError(host, port, incarnation, welcome.agent)
    // With a secret: the listener proved it, or nothing more is sent (its QPs are never connected to).
    const answer = gate.answer(welcome, `${host}:${port}`)
    if (answer instanceof Refusal) return refuse(conn, answer, left())
    unreachable.push(...await connectQps(data, welcome.qps, controlRail, settings.ackTimeout))
    data.notices.start() // before this side's table goes: the peer sends nothing before it has that
    if (answer) await conn.sendJson(answer satisfies ProofMessage, { timeoutMs: left() })
    return welcome
  })
}

/**
 * Answers a connect request (the listening side) that came to the listener of
 * rail `rail` (rdma-transport.ts): its control channel runs there. A request
 * that is not an agent's is rejected.
 */
export async function acceptLink(settings: LinkSettings, request: ConnectionRequest, timeoutMs: number, rail = 0): Promise<RdmaLink> {
  const tag = request.privateData?.subarray(0, CONNECT_TAG.length)
  if (!tag || !CONNECT_TAG.equals(tag)) {
    request.reject()
    throw protocolError('A connect request without the transfer protocol tag was rejected')
  }
  // The peer dialed an earlier incarnation of this agent (a stale record or endpoint): refused, with ours.
  const wanted = wantedIncarnation(request.privateData, CONNECT_TAG.length)
  if (wanted !== undefined && wanted !== settings.agent) {
    request.reject({ privateData: Buffer.concat([STALE_TAG, Buffer.from(settings.agent)]) })
    throw new RdmaError(`A peer asked for incarnation ${wanted} of this agent (this is ${settings.agent}); refused as stale`, { code: 'ERR_STALE_PEER' })
  }
  const deadline = Date.now() + timeoutMs
  const left = () => Math.max(1, deadline - Date.now())
  const conn = await request.accept({ pd: rail === 0 ? settings.pd : settings.railPds[rail - 1]!, receiveJson: true, timeoutMs })
  const unreachable: number[] = []
  return handshake(conn, settings, rail, unreachable, left, async (inbox, open, finish) => {
    const hello = await inbox.expect<HelloMessage>('hello', left())
    checkHello(hello, undefined)
    const gate = new ListenerGate(settings.admission, 'rdma', settings, hello)
    const early = gate.atHello()
    if (early) return refuse(conn, early, left()) // before any QP is made
    // The rails both sides have; the peer's QPs on the others are left unconnected (it closes them).
    const offered = railsOffered(hello)
    const rails = Math.min(offered.rails, 1 + settings.railPds.length)
    open(offered.perRail, rails)
    const data = finish(rails)
    const connectData = async () => {
      unreachable.push(...await connectQps(data, hello.qps, rail, settings.ackTimeout))
      data.notices.start() // before the welcome (or the table): the peer sends nothing before it has that
    }
    const welcome = { t: 'welcome', p: PROTOCOL, agent: settings.agent, name: settings.name, qps: data.qps.map((qp) => qp.endpoint()),
      ...(rails > 1 ? { perRail: offered.perRail } : {}), ...gate.welcome() } satisfies HelloMessage
    if (!gate.proving) {
      await connectData()
      await conn.sendJson(welcome, { timeoutMs: left() })
      return hello
    }
    // The peer must prove the secret first: until then its QPs are not connected to (a QP short of RTR answers nothing) and the table waits.
    await conn.sendJson(welcome, { timeoutMs: left() })
    const refusal = gate.checkProof(await inbox.expect<ProofMessage>('proof', left()))
    if (refusal) return refuse(conn, refusal, left())
    await connectData()
    return hello
  })
}

/** Tells the peer why it is refused (best effort: it may be gone), then fails the handshake with the refusal. */
export async function refuse(conn: ControlChannel, refusal: Refusal, timeoutMs: number): Promise<never> {
  await conn.sendJson(refusal.message, { timeoutMs }).catch(() => undefined)
  throw refusal.error
}
