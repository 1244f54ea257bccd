// The TCP link's handshake, both sides: a hello and a welcome (who each
// agent is, how many lanes the connecting side wants), then the segment
// tables both ways, as the RDMA handshake does (link.ts) but over the socket.
// Then it is a Link like any other: the lanes share the one socket.
import { connect as netConnect, type Socket } from 'node:net'
import { RdmaError } from '../../core/errors.js'
import { ControlInbox, PROTOCOL, protocolError, staleError, type TcpHelloMessage as TcpHello } from '../control.js'
import { exchangeTables, Link, MAX_QPS, refuse } from '../link.js'
import { ConnectorGate, ListenerGate, Refusal, type ProofMessage } from '../admission.js'
import { RemoteTable } from '../segments.js'
import { KeyGrants } from '../grants.js'
import type { AgentLinkSettings } from '../transport.js'
import { TcpChannel, TcpLane, connectionLost } from './channel.js'
import type { SegmentLookup } from './serve.js'


export interface TcpLinkSettings extends AgentLinkSettings { lookup: SegmentLookup }

function checkHello(message: TcpHello, expected: number | undefined): void {
  if (message.p !== PROTOCOL || message.tcp !== 1) throw protocolError(`The peer does not speak the TCP transfer protocol ${PROTOCOL}`)
  if (typeof message.agent !== 'string' || !Number.isInteger(message.lanes) || message.lanes < 1 || message.lanes > MAX_QPS) throw protocolError('The peer sent a malformed handshake')
  if (expected !== undefined && message.lanes !== expected) throw protocolError(`The peer offered ${message.lanes} lanes for ${expected}`)
}

/** A socket's channel, serving the shared segments and those granted on it (`grants`). */
function granted(socket: Socket, settings: TcpLinkSettings, grants: KeyGrants): TcpChannel {
  return new TcpChannel(socket, (key) => {
    const memory = settings.lookup(key)
    return memory && (!memory.perPeer || grants.hasKey(key)) ? memory : undefined
  })
}

/** The common part: `greet` trades hellos; then the tables; a failure closes the socket. */
async function handshake(channel: TcpChannel, grants: KeyGrants, settings: TcpLinkSettings, left: () => number, greet: (inbox: ControlInbox) => Promise<TcpHello>): Promise<Link> {
  try {
    const inbox = new ControlInbox(channel)
    const peer = await greet(inbox)
    const remote = new RemoteTable()
    // TCP grants name no key per lane: the receiving code checks the segment's key against the link's grants.
    const sent = await exchangeTables(channel, inbox, settings, remote, left(), String(peer.name), grants, peer.lanes)
    const lanes = Array.from({ length: peer.lanes }, () => new TcpLane(channel, settings.queueDepth))
    const link = new Link(channel, inbox, lanes, remote, grants, peer.agent, String(peer.name), settings.batchWrs)
    link.sentTable = sent
    return link
  } catch (error) {
    channel.close()
    throw error
  }
}

/** A connected socket within timeoutMs (ETIMEDOUT) or until `signal` aborts (ABORT_ERR); refusals keep their errno. */
function dial(host: string, port: number, timeoutMs: number, signal: AbortSignal | undefined): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host, port })
    const settle = (error: Error | undefined) => {
      clearTimeout(timer)
      signal?.removeEventListener('abort', onAbort)
      socket.off('error', onError)
      if (!error) return resolve(socket)
      socket.destroy()
      reject(error)
    }
    const onError = (error: NodeJS.ErrnoException) => settle(new RdmaError(`Cannot connect to ${host}:${port}: ${error.message}`,
      { code: (/^E[A-Z0-9]+$/.test(error.code ?? '') ? error.code : 'ECONNREFUSED') as 'ECONNREFUSED', cause: error }))
    const onAbort = () => settle(new RdmaError(`Connecting to ${host}:${port} was aborted`, { code: 'ABORT_ERR', cause: signal?.reason }))
    const timer = setTimeout(() => settle(new RdmaError(`Connecting to ${host}:${port} timed out after ${timeoutMs} ms`, { code: 'ETIMEDOUT' })), timeoutMs)
    if (signal?.aborted) return onAbort()
    signal?.addEventListener('abort', onAbort, { once: true })
    socket.once('error', onError)
    socket.once('connect', () => settle(undefined))
  })
}

/** Connects to the agent at host:port over TCP (with `incarnation`: only that one, else ERR_STALE_PEER). */
export async function connectTcpLink(settings: TcpLinkSettings, host: string, port: number, timeoutMs: number, signal?: AbortSignal, incarnation?: string): Promise<Link> {
  const deadline = Date.now() + timeoutMs
  const left = () => Math.max(1, deadline - Date.now())
  const grants = new KeyGrants()
  const channel = granted(await dial(host, port, timeoutMs, signal), settings, grants)
  const gate = new ConnectorGate(settings.admission, 'tcp', settings)
  return handshake(channel, grants, settings, left, async (inbox) => {
    const hello: TcpHello = { t: 'hello', p: PROTOCOL, tcp: 1, agent: settings.agent, name: settings.name, lanes: settings.qps, ...(incarnation !== undefined ? { want: incarnation } : {}), ...gate.hello() }
    await channel.sendJson(hello, { timeoutMs: left() })
    const welcome = await inbox.expect<TcpHello>('welcome', left())
    checkHello(welcome, settings.qps)
    if (incarnation !== undefined && welcome.agent !== incarnation) throw staleError(host, port, incarnation, welcome.agent)
    // With a secret: the listener proved it, or this side serves it nothing and sends it no table.
    const answer = gate.answer(welcome, `${host}:${port}`)
    if (answer instanceof Refusal) return refuse(channel, answer, left())
    channel.open()
    if (answer) await channel.sendJson(answer satisfies ProofMessage, { timeoutMs: left() })
    return welcome
  })
}

/** Answers a peer's socket (the listening side); one that does not open with a TCP agent's hello is dropped (ERR_TRANSFER_PROTOCOL). */
export function acceptTcpLink(settings: TcpLinkSettings, socket: Socket, timeoutMs: number): Promise<Link> {
  const deadline = Date.now() + timeoutMs
  const left = () => Math.max(1, deadline - Date.now())
  const grants = new KeyGrants()
  const channel = granted(socket, settings, grants)
  return handshake(channel, grants, settings, left, async (inbox) => {
    const hello = await inbox.expect<TcpHello>('hello', left())
    checkHello(hello, undefined)
    if (hello.want !== undefined && hello.want !== settings.agent) {
      // The peer dialed an earlier incarnation of this agent: it hears which one is here, and is refused.
      await channel.sendJson({ t: 'welcome', p: PROTOCOL, tcp: 1, agent: settings.agent, name: settings.name, lanes: hello.lanes } satisfies TcpHello, { timeoutMs: left() }).catch(() => undefined)
      throw new RdmaError(`A peer asked for incarnation ${hello.want} of this agent (this is ${settings.agent}); refused as stale`, { code: 'ERR_STALE_PEER' })
    }
    const gate = new ListenerGate(settings.admission, 'tcp', settings, hello)
    const early = gate.atHello()
    if (early) return refuse(channel, early, left())
    const welcome: TcpHello = { t: 'welcome', p: PROTOCOL, tcp: 1, agent: settings.agent, name: settings.name, lanes: hello.lanes, ...gate.welcome() }
    if (!gate.proving) {
      channel.open()
      await channel.sendJson(welcome, { timeoutMs: left() })
      return hello
    }
    // The peer must prove the secret first: until then a data frame of it fails the link, and the table waits.
    await channel.sendJson(welcome, { timeoutMs: left() })
    const refusal = gate.checkProof(await inbox.expect<ProofMessage>('proof', left()))
    if (refusal) return refuse(channel, refusal, left())
    channel.open()
    return hello
  }).catch((error: unknown) => {
    throw (error as RdmaError)?.code === 'ERR_CLOSED' ? connectionLost('The peer closed the connection during the handshake', error) : error
  })
}
