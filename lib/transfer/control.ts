// The control channel of a peer link: JSON messages over the rdma_cm
// connection's own QP (SEND/RECV), in order. It carries the handshake (QP
// endpoints of the data QPs), the segment tables (versioned, in chunks, then
// additions and withdrawals) and notifications. Nothing rides in private data
// but a protocol tag.
import { RdmaError } from '../errors.js'
import type { Connection } from '../cm.js'
import type { QpEndpoint } from '../queue-pair.js'
import type { SegmentEntry } from './segments.js'

/** Version of the messages below; a peer that speaks another is refused. */
export const PROTOCOL = 1
/** Private data of a transfer agent's connect request: tag and protocol. */
export const CONNECT_TAG = Buffer.from(`NIBT${PROTOCOL}`)
/** Segment entries per table message (each message must stay under 4 KiB of JSON). */
export const TABLE_CHUNK = 16
/** Largest notification payload. */
export const MAX_NOTIFICATION_BYTES = 1024
/** Receives kept posted on the control QP. */
const RECEIVES = 32

export interface HelloMessage { t: 'hello' | 'welcome'; p: number; agent: string; name: string; qps: QpEndpoint[] }
/** Segments added (the first table goes in chunks; `end` marks its last one). */
export interface AddMessage { t: 'add'; v: number; seg: SegmentEntry[]; end: boolean }
export interface WithdrawMessage { t: 'del'; v: number; name: string }
/** A notification: a string (s), or bytes in base64 (b; u: 1 when they are a string's UTF-8). */
export interface NotifyMessage { t: 'n'; s?: string; b?: string; u?: 1 }
/** Several messages sent together, handled in order. */
export interface ListMessage { t: 'm'; list: ControlMessage[] }
export type ControlMessage = HelloMessage | AddMessage | WithdrawMessage | NotifyMessage | ListMessage

export function protocolError(message: string): RdmaError {
  return new RdmaError(message, { code: 'ERR_TRANSFER_PROTOCOL' })
}

/** Reads one message during the handshake, checking its type. */
export async function expectMessage<T extends ControlMessage>(conn: Connection, type: T['t'], timeoutMs: number): Promise<T> {
  const message = await conn.receiveJson({ timeoutMs }) as ControlMessage
  if (typeof message !== 'object' || message === null || message.t !== type) {
    throw protocolError(`Expected a '${type}' message from the peer, got ${JSON.stringify(message)?.slice(0, 100)}`)
  }
  return message as T
}

/** Sends the whole table in chunks; the last one has end: true. */
export async function sendTable(conn: Connection, entries: SegmentEntry[], version: number, timeoutMs: number): Promise<void> {
  for (let at = 0; at === 0 || at < entries.length; at += TABLE_CHUNK) {
    await conn.sendJson({ t: 'add', v: version, seg: entries.slice(at, at + TABLE_CHUNK), end: at + TABLE_CHUNK >= entries.length } satisfies AddMessage, { timeoutMs })
  }
}

/** Receives a table sent by sendTable. */
export async function receiveTable(conn: Connection, timeoutMs: number, onChunk: (message: AddMessage) => void): Promise<void> {
  for (;;) {
    const message = await expectMessage<AddMessage>(conn, 'add', timeoutMs)
    onChunk(message)
    if (message.end) return
  }
}

/**
 * Keeps RECEIVES receives posted and hands every message, in arrival order,
 * to `onMessage`; the first failure (the connection went down) goes to
 * `onFailure`, once.
 */
export function pumpMessages(conn: Connection, onMessage: (message: ControlMessage) => void, onFailure: (error: Error) => void): void {
  let failed = false
  const next = (): void => {
    conn.receiveJson().then((message) => {
      if (failed) return
      try {
        onMessage(message as ControlMessage)
      } catch (error) {
        failed = true
        onFailure(error as Error)
        return
      }
      next()
    }, (error: Error) => {
      if (failed) return
      failed = true
      onFailure(error)
    })
  }
  for (let i = 0; i < RECEIVES; i++) next()
}
