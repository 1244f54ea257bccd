// A link to a peer: a control channel plus data lanes. `Link` is the part
// both transports share (the ordered outbox of notifications, table changes,
// failure) and the handshake steps they share (the table exchange, a
// refusal); the RDMA link is in rdma-link.ts, the TCP link in tcp/link.ts. A
// link is used until it fails; then it is torn down as a whole and never
// reused: the next transfer gets a fresh link (fresh QPs, or a fresh socket).
import { performance } from 'node:perf_hooks'
import { RdmaError } from '../core/errors.js'
import { QpPoster, type Lane } from './poster.js'
import type { RemoteTable, SegmentEntry } from './segments.js'
import type { LinkGrants } from './grants.js'
import { receiveTable, sendTable, type AddMessage, type ControlChannel, type ControlInbox, type ControlMessage } from './control.js'
import type { TransferRun } from './run.js'
import { StallWatch } from './stall-watch.js'
import type { NoticeSender } from './notice-sender.js'
import type { AgentLinkSettings } from './transport.js'
import type { RailMeter } from './rails.js'
import type { Refusal } from './admission.js'


/** A message waiting for its turn: `go` is undefined until its data is placed (or failed). */
interface Outgoing { go: boolean | undefined; json: string; message: ControlMessage; resolve: () => void; reject: (error: Error) => void }
/** Control sends in flight per link. */
const SENDING = 8
/** Bytes of JSON packed into one control message (a message holds 4096). */
const MESSAGE_BYTES = 3500


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

/** Most data QPs a peer may ask for. */
export const MAX_QPS = 16

/**
 * Exchanges the tables (both ways at once: neither side waits on the other's
 * receives). The peer `peerName` gets the shared segments and those granted
 * to it, with this link's keys (`grants` binds them); its table names a key
 * per lane for each of its grants.
 */
export async function exchangeTables(conn: ControlChannel, inbox: ControlInbox, settings: Pick<AgentLinkSettings, 'table'>, remote: RemoteTable, timeoutMs: number,
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

/** Tells the peer why it is refused (best effort: it may be gone), then fails the handshake with the refusal. */
export async function refuse(conn: ControlChannel, refusal: Refusal, timeoutMs: number): Promise<never> {
  await conn.sendJson(refusal.message, { timeoutMs }).catch(() => undefined)
  throw refusal.error
}
