// The RDMA link: the rdma_cm control connection plus the data QPs (plain RC
// QPs on a CQ per rail, connected with endpoints exchanged over the control
// channel), and the handshake that makes one (connectLink / acceptLink).
import { performance } from 'node:perf_hooks'
import { connect, type Connection, type ConnectionRequest } from '../cm/index.js'
import { RdmaError } from '../core/errors.js'
import type { CompletionQueue } from '../verbs/completion-queue.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { QpEndpoint } from '../verbs/queue-pair-options.js'
import { QpLane } from './qp-lane.js'
import { RemoteTable } from './segments.js'
import { KeyGrants, WindowGrants, type LinkGrants } from './grants.js'
import { CONNECT_TAG, ControlInbox, PROTOCOL, protocolError, STALE_TAG, staleError, wantedIncarnation, type ControlMessage, type HelloMessage } from './control.js'
import { NOTICE_RECEIVES, NoticeInbox } from './notices.js'
import { NoticeSender } from './notice-sender.js'
import type { AgentLinkSettings } from './transport.js'
import { MAX_RAILS, RailMeter, railOf } from './rails.js'
import { ConnectorGate, ListenerGate, Refusal, type ProofMessage } from './admission.js'
import { exchangeTables, Link, MAX_QPS, refuse } from './link.js'

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
