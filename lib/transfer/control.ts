// The control channel of a peer link: JSON messages over the rdma_cm
// connection's own QP (SEND/RECV), in order. It carries the handshake (QP
// endpoints of the data QPs), the segment tables (versioned, in chunks, then
// additions and withdrawals) and, on a TCP link, notifications (an RDMA
// link's ride on its data QPs: notices.ts). Nothing rides in private data
// but a protocol tag.
import { RdmaError } from '../core/errors.js'
import { bounded } from '../cm/index.js'
import type { WaitOptions } from '../core/validate.js'
import type { QpEndpoint } from '../verbs/queue-pair-options.js'
import type { SegmentEntry } from './segments.js'
import { refusedByPeer, type ProofMessage, type RefusedMessage } from './admission.js'

/** Version of the messages below and of the notices (2: notifications on the data QPs); a peer that speaks another is refused. */
export const PROTOCOL = 2
/** Private data of a transfer agent's connect request: tag and protocol. */
export const CONNECT_TAG = Buffer.from(`NIBT${PROTOCOL}`)
/**
 * Private data of a refusal: the request asked for another incarnation of the
 * agent listening there (followed by the incarnation that is there).
 */
export const STALE_TAG = Buffer.from(`NIBS${PROTOCOL}`)
/** Longest incarnation that fits in a connect request's private data (56 bytes) after the tag. */
export const MAX_INCARNATION = 48

/** The incarnation that follows a tag in private data (rdma_cm pads it with zeros), if any. */
export function wantedIncarnation(data: Buffer | undefined, at: number): string | undefined {
  if (!data || data.length <= at) return undefined
  let end = data.indexOf(0, at)
  if (end < 0) end = data.length
  return end > at ? data.subarray(at, end).toString() : undefined
}

export function staleError(host: string, port: number, wanted: string, found: string | undefined, cause?: unknown): RdmaError {
  return new RdmaError(`The agent at ${host}:${port} is ${found === undefined ? 'another incarnation' : `incarnation ${found}`}, not ${wanted}: the endpoint is stale (the agent restarted)`,
    { code: 'ERR_STALE_PEER', cause })
}

/**
 * Bytes of JSON of the entries in one table message: a control message holds
 * 4096, the envelope ({"t":"add","v":..,"seg":[..],"end":..}) takes the rest.
 * One entry takes at most ~850 (a name of 128 characters that JSON escapes).
 */
const TABLE_BYTES = 3500
/** Largest notification payload. */
export const MAX_NOTIFICATION_BYTES = 1024
/** Receives kept posted on the control QP. */
const RECEIVES = 32

/** Admission fields (admission.ts): the hello's nonce when the connecting side holds a secret; the welcome's nonce and proof when the listening side does. */
export interface AdmissionFields { nonce?: string; proof?: string }
/** `perRail`: with several rails (rails.ts), the QPs of each, laid out rail by rail in `qps` (absent: one rail). */
export interface HelloMessage extends AdmissionFields { t: 'hello' | 'welcome'; p: number; agent: string; name: string; qps: QpEndpoint[]; perRail?: number }
/** Segments added (the first table goes in chunks; `end` marks its last one). */
export interface AddMessage { t: 'add'; v: number; seg: SegmentEntry[]; end: boolean }
export interface WithdrawMessage { t: 'del'; v: number; name: string }
/** The answer to a 'del': this side's batches posted before it have settled (the memory may go). */
export interface ReleasedMessage { t: 'released'; v: number; name: string }
/** A notification: a string (s), or bytes in base64 (b; u: 1 when they are a string's UTF-8). */
export interface NotifyMessage { t: 'n'; s?: string; b?: string; u?: 1 }
/** Several messages sent together, handled in order. */
export interface ListMessage { t: 'm'; list: ControlMessage[] }
/** The TCP link's hello (tcp/link.ts): lanes instead of QP endpoints; `want` asks for one incarnation. */
export interface TcpHelloMessage extends AdmissionFields { t: 'hello' | 'welcome'; p: number; tcp: 1; agent: string; name: string; lanes: number; want?: string }
export type ControlMessage = HelloMessage | TcpHelloMessage | AddMessage | WithdrawMessage | ReleasedMessage | NotifyMessage | ListMessage | ProofMessage | RefusedMessage

/**
 * What the link needs of its control connection: in-order JSON messages both
 * ways and a 'disconnected' event. An rdma_cm Connection is one; a TCP
 * link's socket gives another (tcp/channel.ts).
 */
export interface ControlChannel {
  /** Resolves when the message is sent (RDMA: the peer's device has it; TCP: the kernel has it). */
  sendJson(value: unknown, options?: WaitOptions): Promise<void>
  receiveJson(): Promise<unknown>
  on(event: 'disconnected', listener: () => void): unknown
  close(): void
}

export function protocolError(message: string): RdmaError {
  return new RdmaError(message, { code: 'ERR_TRANSFER_PROTOCOL' })
}

/**
 * The control connection's incoming messages, from the moment it is
 * connected: RECEIVES receives stay posted at all times, the handshake
 * included, so a message of the peer never finds the receive queue empty.
 * (A SEND that finds no receive is answered with an RNR NAK and retried only
 * after the responder's RNR timer, 655 ms as rdma_cm sets it: with receives
 * posted one per waiting read, the listening side's table met an empty queue
 * on every handshake, which cost 655 ms per connect and left the listening
 * side's last step, the completion of that SEND, behind the connecting
 * side's.) Messages are read one at a time during the handshake (`expect`),
 * then handed over in arrival order (`listen`).
 */
export class ControlInbox {
  readonly #conn: ControlChannel
  readonly #queue: ControlMessage[] = []
  readonly #waiters: Array<{ resolve: (m: ControlMessage) => void; reject: (e: Error) => void }> = []
  #failure: Error | undefined
  #onMessage: ((message: ControlMessage) => void) | undefined
  #onFailure: ((error: Error) => void) | undefined
  #failureReported = false

  constructor(conn: ControlChannel) {
    this.#conn = conn
    for (let i = 0; i < RECEIVES; i++) this.#receive()
  }

  /** One receive; when its message comes, the next one is posted (before the message is handled). */
  #receive(): void {
    this.#conn.receiveJson().then((message) => {
      if (this.#failure) return
      this.#receive()
      this.#deliver(message as ControlMessage)
    }, (error: Error) => this.#fail(error))
  }

  #deliver(message: ControlMessage): void {
    if (this.#onMessage) {
      try {
        this.#onMessage(message)
      } catch (error) {
        this.#fail(error as Error)
      }
      return
    }
    const waiter = this.#waiters.shift()
    if (waiter) waiter.resolve(message)
    else this.#queue.push(message)
  }

  #fail(error: Error): void {
    if (!this.#failure) {
      this.#failure = error
      for (const waiter of this.#waiters.splice(0)) waiter.reject(error)
    }
    this.#reportFailure()
  }

  #reportFailure(): void {
    if (!this.#onFailure || !this.#failure || this.#failureReported) return
    this.#failureReported = true
    this.#onFailure(this.#failure)
  }

  /** The next message (during the handshake), which must be of type `type` (a 'refused' one: ERR_PEER_REFUSED). */
  async expect<T extends ControlMessage>(type: T['t'], timeoutMs: number): Promise<T> {
    const message = await this.#next(timeoutMs)
    if (typeof message === 'object' && message !== null && message.t === 'refused' && type !== 'refused') throw refusedByPeer(message.why)
    if (typeof message !== 'object' || message === null || message.t !== type) {
      throw protocolError(`Expected a '${type}' message from the peer, got ${JSON.stringify(message)?.slice(0, 100)}`)
    }
    return message as T
  }

  #next(timeoutMs: number): Promise<ControlMessage> {
    const queued = this.#queue.shift()
    if (queued !== undefined) return Promise.resolve(queued)
    if (this.#failure) return Promise.reject(this.#failure)
    let waiter!: { resolve: (m: ControlMessage) => void; reject: (e: Error) => void }
    const next = new Promise<ControlMessage>((resolve, reject) => { waiter = { resolve, reject } })
    this.#waiters.push(waiter)
    return bounded(next, 'receiveJson', { timeoutMs }).catch((error: unknown) => {
      const index = this.#waiters.indexOf(waiter)
      if (index >= 0) this.#waiters.splice(index, 1) // gave up: a later message goes to the queue
      throw error
    })
  }

  /**
   * After the handshake: every message, in arrival order (those already here
   * first), goes to `onMessage`; the first failure (the connection went down,
   * or `onMessage` threw) goes to `onFailure`, once.
   */
  listen(onMessage: (message: ControlMessage) => void, onFailure: (error: Error) => void): void {
    this.#onFailure = onFailure
    for (const message of this.#queue.splice(0)) {
      if (this.#failureReported) return
      try {
        onMessage(message)
      } catch (error) {
        this.#fail(error as Error)
        return
      }
    }
    this.#onMessage = (message) => { if (!this.#failureReported) onMessage(message) }
    this.#reportFailure()
  }
}

/**
 * Table entries as 'add' messages that each fit one control message (packed
 * in order by the bytes of their JSON; the last has end: true; no entries:
 * one empty message). The handshake sends the whole table so, and the
 * changes after it (agent resync) too.
 */
export function tableMessages(entries: readonly SegmentEntry[], version: number): AddMessage[] {
  const messages: AddMessage[] = []
  let seg: SegmentEntry[] = []
  let bytes = 0
  for (const entry of entries) {
    const size = Buffer.byteLength(JSON.stringify(entry)) + 1
    if (seg.length > 0 && bytes + size > TABLE_BYTES) {
      messages.push({ t: 'add', v: version, seg, end: false })
      seg = []
      bytes = 0
    }
    seg.push(entry)
    bytes += size
  }
  messages.push({ t: 'add', v: version, seg, end: true })
  return messages
}

/** Sends the whole table in chunks (tableMessages); the last one has end: true. */
export async function sendTable(conn: ControlChannel, entries: SegmentEntry[], version: number, timeoutMs: number): Promise<void> {
  for (const message of tableMessages(entries, version)) await conn.sendJson(message, { timeoutMs })
}

/** Receives a table sent by sendTable. */
export async function receiveTable(inbox: ControlInbox, timeoutMs: number, onChunk: (message: AddMessage) => void): Promise<void> {
  for (;;) {
    const message = await inbox.expect<AddMessage>('add', timeoutMs)
    onChunk(message)
    if (message.end) return
  }
}
