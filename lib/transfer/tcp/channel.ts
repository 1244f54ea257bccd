// One TCP link's socket: the control channel (JSON frames, in order, as the
// rdma_cm connection's QP carries them) and the data plane both ways. As the
// initiator it sends batches of slices (writes: the bytes are views of the
// segment, written without a copy; reads: requests whose answers are read
// straight into the destination) and settles each batch on the peer's ack;
// as the target it serves the peer's frames against this agent's segments
// (serve.ts). A socket that ends, resets or errs fails everything in flight
// with ECONNRESET.
import { EventEmitter } from 'node:events'
import type { Socket } from 'node:net'
import { bounded } from '../../cm/index.js'
import { RdmaError } from '../../core/errors.js'
import type { WaitOptions } from '../../core/validate.js'
import type { ControlChannel } from '../control.js'
import type { CheckedPlan } from '../plan.js'
import type { Lane } from '../poster.js'
import { FrameReader, FrameType, head, HEADER, protocolError, Refusal, SLICE, writeHead, writeSlice, type FrameHead, type FrameSink, type Placement } from './frames.js'
import { SegmentServer, type SegmentLookup } from './serve.js'

interface PendingBatch {
  op: 'read' | 'write'
  resolve: () => void
  reject: (error: Error) => void
  /** A read's destinations: where each slice's bytes go. */
  place: Placement | undefined
}

const WHY: Record<number, string> = {
  [Refusal.Unknown]: 'the segment is not registered there (never, or withdrawn)',
  [Refusal.Rights]: 'the segment\'s rights do not allow it',
  [Refusal.Bounds]: 'the range is outside the segment',
}

function refused(op: string, status: number): RdmaError {
  return new RdmaError(`The peer refused the ${op}: ${WHY[status] ?? `reason ${status}`} (its agent checks every frame: TCP has no NIC enforcement)`,
    { code: 'REM_ACCESS_ERR', status: 'REM_ACCESS_ERR' })
}

export function connectionLost(message: string, cause?: unknown): RdmaError {
  return new RdmaError(message, { code: 'ECONNRESET', ...(cause !== undefined ? { cause } : {}) })
}

export class TcpChannel extends EventEmitter implements ControlChannel, FrameSink {
  readonly #socket: Socket
  readonly #reader: FrameReader
  readonly #server: SegmentServer
  readonly #messages: unknown[] = []
  readonly #waiters: Array<{ resolve: (m: unknown) => void; reject: (e: Error) => void }> = []
  readonly #pending = new Map<number, PendingBatch>()
  #serving = false
  #corked = false
  #nextBatch = 1
  #failure: RdmaError | undefined

  constructor(socket: Socket, lookup: SegmentLookup) {
    super()
    this.#socket = socket
    this.#reader = new FrameReader(this)
    this.#server = new SegmentServer(lookup, (part) => { socket.write(part) })
    socket.setNoDelay(true)
    socket.on('data', (chunk: Buffer) => {
      // Answers written while a chunk is parsed leave together.
      socket.cork()
      try {
        this.#reader.push(chunk)
      } catch (error) {
        this.#fail(error instanceof RdmaError ? error : protocolError(`Bad frame from the peer: ${(error as Error).message}`))
      } finally {
        socket.uncork()
      }
    })
    socket.on('end', () => this.#fail(connectionLost('The peer closed the connection (its process or link is gone)')))
    socket.on('error', (error) => this.#fail(connectionLost(`The connection to the peer failed: ${error.message}`, error)))
    socket.on('close', () => this.#fail(connectionLost('The connection to the peer closed')))
  }

  get failed(): boolean { return this.#failure !== undefined }

  /** Serves the peer's data frames from now on (after its hello: nothing is served to a socket that did not say who it is). */
  open(): void { this.#serving = true }

  // --- control ---------------------------------------------------------------

  sendJson(value: unknown, options: WaitOptions = {}): Promise<void> {
    if (this.#failure) return Promise.reject(this.#failure)
    const json = Buffer.from(JSON.stringify(value))
    const sent = new Promise<void>((resolve, reject) => {
      this.#socket.write(head(FrameType.Control, 0, 0, 0, json.length))
      this.#socket.write(json, (error) => error ? reject(this.#failure ?? connectionLost(error.message, error)) : resolve())
    })
    return bounded(sent, 'sendJson', options)
  }

  receiveJson(): Promise<unknown> {
    const queued = this.#messages.shift()
    if (queued !== undefined) return Promise.resolve(queued)
    if (this.#failure) return Promise.reject(this.#failure)
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }))
  }

  #deliver(message: unknown): void {
    const waiter = this.#waiters.shift()
    if (waiter) waiter.resolve(message)
    else this.#messages.push(message)
  }

  // --- frames in -------------------------------------------------------------

  place(frame: FrameHead, table: Buffer): Placement {
    if (frame.type === FrameType.WriteBatch) {
      this.#assertServing()
      return this.#server.placeWrite(frame, table)
    }
    // ReadData: the answer to one of our reads.
    const batch = this.#pending.get(frame.batch)
    if (!batch?.place || frame.slices !== batch.place.lengths.length) throw protocolError(`The peer sent read data for no read of ours (batch ${frame.batch})`)
    return batch.place
  }

  end(frame: FrameHead, table: Buffer): void {
    switch (frame.type) {
      case FrameType.Control: {
        let message: unknown
        try { message = JSON.parse(table.toString()) } catch { throw protocolError('The peer sent a control message that is not JSON') }
        return this.#deliver(message)
      }
      case FrameType.WriteBatch: return this.#server.writeDone(frame)
      case FrameType.ReadBatch: this.#assertServing(); return this.#server.read(frame, table)
      case FrameType.ReadData: return this.#settle(frame, 'read', Refusal.None)
      case FrameType.WriteAck: return this.#settle(frame, 'write', frame.status)
      case FrameType.ReadAck: return this.#settle(frame, 'read', frame.status === Refusal.None ? -1 : frame.status)
    }
  }

  #assertServing(): void {
    if (!this.#serving) throw protocolError('The peer sent data frames before its hello')
  }

  /** A batch of ours answered: `status` 0 placed, else refused (-1: a read acked without its data). */
  #settle(frame: FrameHead, op: 'read' | 'write', status: number): void {
    const batch = this.#pending.get(frame.batch)
    if (!batch || batch.op !== op || status < 0) throw protocolError(`The peer answered batch ${frame.batch}, which is not a ${op} in flight`)
    this.#pending.delete(frame.batch)
    if (status !== Refusal.None) return batch.reject(refused(op, status))
    batch.resolve()
  }

  // --- frames out ------------------------------------------------------------

  /**
   * Sends slices from..to of the plan as one batch frame: its slice table,
   * then (a write) the slices' bytes as views of the segments, no copy.
   * Settles on the peer's answer (a read: once its bytes are in place here).
   */
  postBatch(plan: CheckedPlan, from: number, to: number): Promise<void> {
    if (this.#failure) return Promise.reject(this.#failure)
    const batch = this.#nextBatch
    this.#nextBatch = this.#nextBatch >= 0xffffffff ? 1 : this.#nextBatch + 1
    const { slices, locals, remotes } = plan
    const read = plan.op === 'read'
    const count = to - from
    const table = Buffer.allocUnsafe(HEADER + count * SLICE)
    const place: Placement | undefined = read ? { arrays: new Array(count), offsets: new Array(count), lengths: new Array(count), skip: false } : undefined
    let bytes = 0
    for (let i = from, at = HEADER; i < to; i++, at += SLICE) {
      const len = slices.len[i]!
      writeSlice(table, at, remotes[slices.rseg[i]!]!.region.rkey, len, slices.roff[i]!)
      bytes += len
      if (place) {
        const k = i - from
        place.arrays[k] = locals[slices.lseg[i]!]!.region.bytes
        place.offsets[k] = slices.loff[i]!
        place.lengths[k] = len
      }
    }
    writeHead(table, 0, read ? FrameType.ReadBatch : FrameType.WriteBatch, 0, batch, count, count * SLICE + (read ? 0 : bytes))
    const socket = this.#socket
    this.#cork()
    socket.write(table)
    if (!read) {
      for (let i = from; i < to; i++) {
        const loff = slices.loff[i]!
        socket.write(locals[slices.lseg[i]!]!.region.bytes.subarray(loff, loff + slices.len[i]!))
      }
    }
    return new Promise<void>((resolve, reject) => {
      this.#pending.set(batch, { op: plan.op, resolve, reject, place })
    })
  }

  /** Corks the socket until the current tick's work is done: the batches posted together leave in one writev. */
  #cork(): void {
    if (this.#corked) return
    this.#corked = true
    this.#socket.cork()
    process.nextTick(() => {
      this.#corked = false
      this.#socket.uncork()
    })
  }

  // --- failure and close -----------------------------------------------------

  #fail(error: RdmaError, emit = true): void {
    if (this.#failure) return
    this.#failure = error
    for (const waiter of this.#waiters.splice(0)) waiter.reject(error)
    if (emit) this.emit('disconnected')
    for (const batch of this.#pending.values()) batch.reject(error)
    this.#pending.clear()
    this.#socket.destroy()
  }

  /** Closes the link's socket: what was written goes first (a notification sent just before is delivered). */
  close(): void {
    if (this.#failure) return
    this.#failure = new RdmaError('The link was closed', { code: 'ERR_CLOSED' })
    for (const waiter of this.#waiters.splice(0)) waiter.reject(this.#failure)
    for (const batch of this.#pending.values()) batch.reject(this.#failure)
    this.#pending.clear()
    this.#socket.end()
    setTimeout(() => this.#socket.destroy(), 2000).unref()
  }
}

/** A lane of a TCP link: its poster's batches go over the link's one socket. */
export class TcpLane implements Lane {
  readonly rail = 0
  constructor(readonly channel: TcpChannel, readonly depth: number) {}
  get broken(): boolean { return this.channel.failed }
  post(plan: CheckedPlan, from: number, to: number): Promise<void> { return this.channel.postBatch(plan, from, to) }
  close(): void { /* the link closes the channel */ }
}
