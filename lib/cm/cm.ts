// Connections by IP address and port with rdma_cm: listen/accept/reject,
// connect with private data and timeouts, disconnect. The rdma_cm event
// channel is watched on the event loop; every wait is bounded.
import { EventEmitter } from 'node:events'
import { isIP } from 'node:net'
import { lookup } from 'node:dns/promises'
import { native, type NativeCmEvent, type NativeCmEventChannel, type NativeCmId } from '../native/addon.js'
import { call, closedError, errnoName, RdmaError } from '../core/errors.js'
import type { RdmaErrorCode } from '../core/error-codes.js'
import { integer, instance, object, optionalObject, rangeError, tooLarge, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { openDevice, type Device } from '../verbs/device.js'
import { deferDestroyWhilePortDown } from './deferred-destroy.js'
import { ProtectionDomain } from '../verbs/protection-domain.js'
import { CompletionQueue, type CompletionQueueOptions } from '../verbs/completion-queue.js'
import { QueuePair } from '../verbs/queue-pair.js'
import { Access } from '../core/constants.js'
import type { MemoryRegion } from '../verbs/memory.js'

export interface QpCaps { maxSendWr?: number; maxRecvWr?: number; maxSendSge?: number; maxRecvSge?: number; maxInlineData?: number }

/** Resources of a connection. Without `pd`, the connection opens its device and PD itself (and closes them). */
export interface ConnectionSetup {
  /** Protection domain (of the device that serves the address) whose memory the connection will use. */
  pd?: ProtectionDomain
  /** A completion queue to share; default: one of the connection's own. */
  cq?: CompletionQueue
  cqOptions?: CompletionQueueOptions
  qp?: QpCaps
  /** Outstanding RDMA READ/atomic operations as responder / initiator (default: 16 or the device's limit). */
  responderResources?: number
  initiatorDepth?: number
  /** Post a receive for receiveJson() before the connection is established (so the peer may send at once). */
  receiveJson?: boolean
  /**
   * The QP's local ACK timeout, as the exponent of 4.096 µs · 2^ackTimeout (0-31; 14 is 67 ms): how
   * long a request waits for its acknowledgement or READ response before it is sent again. Default:
   * what rdma_cm derives from the path; on RoCE Linux gives 19, 2.1 s per retransmission, which makes
   * every packet lost on the wire cost 2.1 s (docs/reliability.md). Not negotiated with the peer.
   */
  ackTimeout?: number
}

export interface ConnectionOptions extends ConnectionSetup, WaitOptions {
  host: string
  port: number
  /** Up to 56 bytes the listener sees with the request (RC over IB/RoCE). */
  privateData?: Uint8Array
  /** Bound on address and route resolution and connection (default 10000 ms). */
  timeoutMs?: number
  /** Called with the new QP (state INIT) before rdma_connect: post receives here so the peer may send at once. */
  beforeConnect?: (qp: QueuePair) => void
}

/** Options of request.accept(). */
export interface AcceptOptions extends ConnectionSetup, WaitOptions {
  /** Up to 196 bytes the connecting side gets as connection.privateData. */
  privateData?: Uint8Array
  /** Called with the new QP (state INIT) before rdma_accept: post receives here so the peer may send at once. */
  beforeAccept?: (qp: QueuePair) => void
}

/** Options of request.reject(). */
export interface RejectOptions {
  /** Up to 148 bytes the connecting side gets as error.privateData. */
  privateData?: Uint8Array
}

/** An IP address and port of an rdma_cm id (local or peer). */
export interface CmAddress { address: string; port: number; family: 'IPv4' | 'IPv6' }

/** Connection events and their listeners' arguments. */
export interface ConnectionEvents {
  /** The peer disconnected, or the device went away; requests in flight fail with ECONNRESET. */
  disconnected: [reason: 'DISCONNECTED' | 'DEVICE_REMOVAL']
}

/** Listener events and their listeners' arguments. */
export interface ListenerEvents {
  /** A connection request; while any 'request' listener exists, requests go to it rather than to accept() / iteration. */
  request: [request: ConnectionRequest]
}

export interface ListenOptions {
  host: string
  /** 0 picks a free port: see listener.address. */
  port: number
  backlog?: number
  /** Default PD for accepted connections. */
  pd?: ProtectionDomain
}

const EVENT_PREFIX = 'RDMA_CM_EVENT_'
const DEFAULT_TIMEOUT = 10_000
const JSON_BYTES = 4096
const CAP_FIELDS = ['maxSendWr', 'maxRecvWr', 'maxSendSge', 'maxRecvSge', 'maxInlineData'] as const

function timedOut(verb: string, timeoutMs: number | undefined): RdmaError {
  return new RdmaError(`${verb} timed out after ${timeoutMs} ms`, { code: 'ETIMEDOUT', verb })
}

function aborted(verb: string, signal: AbortSignal | undefined): RdmaError {
  return new RdmaError(`${verb} was aborted`, { code: 'ABORT_ERR', verb, cause: signal?.reason })
}

/**
 * @internal Settles as `promise` does, or rejects with ETIMEDOUT / ABORT_ERR
 * when `wait` runs out first. The work behind `promise` goes on: callers that
 * own resources release them when `promise` itself settles.
 */
export function bounded<T>(promise: Promise<T>, verb: string, wait: WaitOptions): Promise<T> {
  if (wait.timeoutMs === undefined && wait.signal === undefined) return promise
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => settle(() => reject(aborted(verb, wait.signal)))
    const timer = wait.timeoutMs === undefined ? undefined : setTimeout(() => settle(() => reject(timedOut(verb, wait.timeoutMs))), wait.timeoutMs)
    const settle = (action: () => void) => {
      clearTimeout(timer)
      wait.signal?.removeEventListener('abort', onAbort)
      action()
    }
    if (wait.signal?.aborted) return onAbort()
    wait.signal?.addEventListener('abort', onAbort, { once: true })
    promise.then((value) => settle(() => resolve(value)), (error: unknown) => settle(() => reject(error)))
  })
}

// --- the event channel -------------------------------------------------------

interface Waiter { success: string; resolve: (event: NativeCmEvent) => void; reject: (error: Error) => void }

/** An rdma_cm id and the one step (if any) waiting for its next event. */
class CmIdHandle {
  #waiter: Waiter | undefined
  onUnexpected: (event: NativeCmEvent) => void = () => {}
  closed = false
  /** A listening id sends nothing when destroyed, and must free its port at once. */
  listening = false
  constructor(readonly native: NativeCmId, readonly key: number) {}

  /** Runs `action` and resolves with the event named `success`; any other event of the step rejects. */
  step(verb: string, action: () => void, success: string, wait: WaitOptions): Promise<NativeCmEvent> {
    return new Promise((resolve, reject) => {
      if (this.closed) return reject(closedError('Connection'))
      // One waiter per id: a second step would orphan the first one's promise.
      if (this.#waiter) return reject(new RdmaError(`${verb}: another rdma_cm step is in progress on this connection`, { code: 'ERR_BUSY', verb }))
      let timer: NodeJS.Timeout | undefined
      const onAbort = () => finish(aborted(verb, wait.signal))
      const finish = (error: Error | undefined, event?: NativeCmEvent) => {
        if (this.#waiter !== waiter) return
        this.#waiter = undefined
        channel().release(this)
        if (timer) clearTimeout(timer)
        wait.signal?.removeEventListener('abort', onAbort)
        if (error) reject(error)
        else resolve(event!)
      }
      const waiter: Waiter = { success, resolve: (e) => finish(undefined, e), reject: (e) => finish(e) }
      if (wait.signal?.aborted) return reject(aborted(verb, wait.signal))
      this.#waiter = waiter
      channel().hold(this)
      if (wait.timeoutMs !== undefined) timer = setTimeout(() => finish(timedOut(verb, wait.timeoutMs)), wait.timeoutMs)
      wait.signal?.addEventListener('abort', onAbort, { once: true })
      try {
        action()
      } catch (error) {
        finish(error as Error)
      }
    })
  }

  deliver(event: NativeCmEvent): void {
    const waiter = this.#waiter
    if (!waiter) return this.onUnexpected(event)
    if (event.type === waiter.success) waiter.resolve(event)
    else waiter.reject(eventError(event))
  }

  fail(error: Error): void {
    this.#waiter?.reject(error)
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    this.fail(closedError('Connection'))
    channel().forget(this.key)
    if (this.listening || !deferDestroyWhilePortDown(this.native)) call(() => this.native.close())
  }

  /** A MAD sent while the port is down breaks rdma_cm on rxe (cm-deferred-destroy.ts). */
  get portActive(): boolean {
    return this.closed || this.native.portActive()
  }
}

function eventError(event: NativeCmEvent): RdmaError {
  const details = { privateData: event.privateData, cmStatus: event.status }
  const make = (code: RdmaErrorCode, message: string) => Object.assign(new RdmaError(message, { code, status: event.type }), details)
  switch (event.type) {
    case 'REJECTED': return make('ECONNREFUSED', `Connection rejected (status ${event.status}${event.privateData ? ', with private data' : ''})`)
    case 'UNREACHABLE': return make('EHOSTUNREACH', `Peer unreachable (status ${event.status})`)
    case 'ADDR_ERROR': return make('ADDR_ERROR', `Address resolution failed (status ${event.status})`)
    case 'ROUTE_ERROR': return make('ROUTE_ERROR', `Route resolution failed (status ${event.status})`)
    case 'CONNECT_ERROR': return make('CONNECT_ERROR', `Connection failed (status ${event.status})`)
    case 'DISCONNECTED': return make('ECONNRESET', 'The peer disconnected')
    default: return make('ERR_CM_EVENT', `Unexpected rdma_cm event ${event.type} (status ${event.status})`)
  }
}

class CmChannel {
  readonly handle: NativeCmEventChannel
  // Weak: a connection nobody references any more is collected with its id
  // (its native finalizer destroys the id). Ids with a step in progress and
  // listening ids are held in #pinned, so their promises can still settle.
  readonly #ids = new Map<number, WeakRef<CmIdHandle>>()
  readonly #collected = new FinalizationRegistry<number>((key) => {
    if (this.#ids.get(key)?.deref() === undefined) this.#ids.delete(key)
  })
  readonly #pinned = new Set<CmIdHandle>()
  readonly #listeners = new Map<number, Listener>()
  readonly #onEvent = (event: NativeCmEvent): void => this.#dispatch(event) // the addon holds it weakly

  constructor() {
    this.handle = call(() => new native.CmEventChannel(this.#onEvent))
  }

  createId(): CmIdHandle {
    return this.adopt(call(() => new native.CmId(this.handle)))
  }

  adopt(id: NativeCmId): CmIdHandle {
    const handle = new CmIdHandle(id, id.key)
    this.#ids.set(handle.key, new WeakRef(handle))
    this.#collected.register(handle, handle.key)
    return handle
  }

  forget(key: number): void {
    this.#ids.delete(key)
    this.#listeners.delete(key)
  }

  addListener(key: number, listener: Listener): void { this.#listeners.set(key, listener) }

  /** Keeps the loop alive, and `id` reachable, while a step waits or a listener is open. */
  hold(id: CmIdHandle): void {
    this.#pinned.add(id)
    if (this.#pinned.size === 1) this.handle.setWaiting(true)
  }

  release(id: CmIdHandle): void {
    if (this.#pinned.delete(id) && this.#pinned.size === 0) this.handle.setWaiting(false)
  }

  #dispatch(event: NativeCmEvent): void {
    event.type = event.type.replace(EVENT_PREFIX, '')
    if (event.type === 'CHANNEL_ERROR') return this.#failAll(-event.status)
    if (event.type === 'CONNECT_REQUEST' && event.id) {
      const id = this.adopt(event.id)
      const listener = this.#listeners.get(event.listenKey)
      if (listener) listener.push(new ConnectionRequest(listener, id, event))
      else id.close()
      return
    }
    this.#ids.get(event.key)?.deref()?.deliver(event)
  }

  // The channel's fd failed (the addon stopped watching it): no event will
  // come, so every step waiting for one fails now.
  #failAll(errno: number): void {
    const code = errnoName(errno)
    const error = new RdmaError(`rdma_get_cm_event: the event channel failed (${code})`, { code, errno, syscall: 'rdma_get_cm_event' })
    for (const ref of this.#ids.values()) ref.deref()?.fail(error)
    if (sharedChannel === this) sharedChannel = undefined // later connections get a new channel
  }
}

let sharedChannel: CmChannel | undefined
function channel(): CmChannel {
  sharedChannel ??= new CmChannel()
  return sharedChannel
}

/** The host as a numeric address: names are looked up (getaddrinfo) within `wait`. */
async function numericHost(host: unknown, name: string, wait: WaitOptions = {}): Promise<string> {
  if (typeof host !== 'string' || host.length === 0) throw typeError('a host name or IP address', name, host)
  if (isIP(host)) return host
  // getaddrinfo cannot be cancelled: on timeout or abort it finishes in the background, unheeded.
  return (await bounded(lookup(host), 'resolve name', wait)).address
}

// --- connections -------------------------------------------------------------

/** A connection stays reachable from its QP: whoever holds conn.qp still gets 'disconnected' handled. */
const connectionOf = new WeakMap<QueuePair, Connection>()

/** Only the capacity fields of options.qp: the type and the CQs are the connection's own. */
function qpCaps(value: unknown): QpCaps {
  const o = optionalObject(value, 'options.qp')
  const caps: Record<string, unknown> = {}
  for (const field of CAP_FIELDS) if (o[field] !== undefined) caps[field] = o[field]
  return caps as QpCaps
}

interface JsonSlot { region: MemoryRegion; offset: number }
type Received = { value: unknown } | { error: unknown }
interface Receiver { resolve: (value: unknown) => void; reject: (error: unknown) => void }

/**
 * JSON messages over a connection's QP. Every message in flight has a 4 KiB
 * slot of its own (from regions that grow by doubling and are reused), held
 * until its work request completes, even when the caller gave up waiting: so
 * concurrent calls never touch bytes the device has not read or written yet.
 * Receives are posted one per waiting call; a message nobody waits for any
 * more (its call timed out) goes to the next call, none is lost.
 */
class JsonMessages {
  readonly #qp: QueuePair
  readonly #regions: MemoryRegion[] = []
  readonly #free: JsonSlot[] = []
  readonly #inbox: Received[] = []
  readonly #receivers: Receiver[] = []
  #posted = 0
  #closed = false

  constructor(qp: QueuePair) { this.#qp = qp }

  async send(value: unknown, wait: WaitOptions): Promise<void> {
    if (this.#closed) throw closedError('Connection')
    const bytes = Buffer.from(JSON.stringify(value))
    if (bytes.length > JSON_BYTES) throw tooLarge(`JSON message of ${bytes.length} bytes is over ${JSON_BYTES}`)
    if (wait.signal?.aborted) throw aborted('sendJson', wait.signal)
    const slot = this.#take()
    const free = () => this.#give(slot)
    let sent: Promise<unknown>
    try {
      slot.region.bytes.set(bytes, slot.offset)
      sent = this.#qp.send(slot.region.slice(slot.offset, bytes.length))
    } catch (error) {
      free()
      throw error
    }
    sent.then(free, free) // the slot is reusable only once the device is done with it
    await bounded(sent, 'sendJson', wait)
  }

  receive(wait: WaitOptions): Promise<unknown> {
    if (this.#closed) return Promise.reject(closedError('Connection'))
    const ready = this.#inbox.shift()
    if (ready) return 'error' in ready ? Promise.reject(ready.error) : Promise.resolve(ready.value)
    if (wait.signal?.aborted) return Promise.reject(aborted('receiveJson', wait.signal))
    let receiver!: Receiver
    const received = new Promise<unknown>((resolve, reject) => { receiver = { resolve, reject } })
    this.#receivers.push(receiver)
    const gaveUp = (error: unknown) => {
      const index = this.#receivers.indexOf(receiver)
      if (index >= 0) this.#receivers.splice(index, 1) // its receive (if posted) stays posted for the next call
      throw error
    }
    try {
      if (this.#posted < this.#receivers.length) this.postReceive()
    } catch (error) {
      return Promise.reject(error).catch(gaveUp)
    }
    return bounded(received, 'receiveJson', wait).catch(gaveUp)
  }

  /** Posts one receive into a slot of its own; its message goes to the first waiting call, or the inbox. */
  postReceive(): void {
    const slot = this.#take()
    this.#posted++
    const settle = (result: Received) => {
      this.#posted--
      this.#give(slot)
      const receiver = this.#receivers.shift()
      if (!receiver) this.#inbox.push(result)
      else if ('error' in result) receiver.reject(result.error)
      else receiver.resolve(result.value)
    }
    this.#qp.recv(slot.region.slice(slot.offset, JSON_BYTES)).then((wc) => {
      let result: Received
      try {
        result = { value: JSON.parse(Buffer.from(slot.region.bytes.subarray(slot.offset, slot.offset + wc.byteLength)).toString()) }
      } catch (error) {
        result = { error }
      }
      settle(result)
    }, (error: unknown) => settle({ error }))
  }

  /** Call after the QP is closed (its requests released the slots' regions). */
  close(): void {
    this.#closed = true
    for (const region of this.#regions.splice(0)) region.close()
    this.#free.length = 0
  }

  #take(): JsonSlot {
    if (this.#free.length === 0) this.#grow()
    return this.#free.pop()!
  }

  #give(slot: JsonSlot): void {
    if (!this.#closed) this.#free.push(slot)
  }

  #grow(): void {
    const count = 2 ** (this.#regions.length + 1) // 2, 4, 8, ... slots: the total doubles
    const region = this.#qp.pd.allocRegion(count * JSON_BYTES, Access.LocalWrite)
    this.#regions.push(region)
    for (let i = count - 1; i >= 0; i--) this.#free.push({ region, offset: i * JSON_BYTES })
  }
}

/** Typed listener methods (the rest of EventEmitter is Node's). */
export interface Connection {
  on<E extends keyof ConnectionEvents>(event: E, listener: (...args: ConnectionEvents[E]) => void): this
  once<E extends keyof ConnectionEvents>(event: E, listener: (...args: ConnectionEvents[E]) => void): this
  off<E extends keyof ConnectionEvents>(event: E, listener: (...args: ConnectionEvents[E]) => void): this
}

export class Connection extends EventEmitter {
  readonly device: Device
  readonly pd: ProtectionDomain
  readonly cq: CompletionQueue
  readonly qp: QueuePair
  /** Private data the peer sent with its request (listener side) or acceptance (connecting side). */
  privateData: Buffer | undefined
  readonly #id: CmIdHandle
  readonly #owned: Array<{ close(): void }>
  readonly #json: JsonMessages
  #disconnecting: Promise<void> | undefined
  #disconnected = false
  #closed = false

  /** Not constructible: made by connect() or request.accept(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(id: CmIdHandle, setup: ConnectionSetup, fallbackPd: ProtectionDomain | undefined)
  constructor(id: CmIdHandle, setup: ConnectionSetup, fallbackPd: ProtectionDomain | undefined) {
    super()
    this.#id = id
    this.#owned = []
    const deviceName = id.native.deviceName()
    if (deviceName === null) throw new RdmaError('rdma_cm found no RDMA device for this address', { code: 'ENODEV' })
    let pd = setup.pd ?? fallbackPd
    if (pd !== undefined) {
      instance(pd, 'pd', ProtectionDomain)
      if (pd.device.name !== deviceName) throw new RdmaError(`The connection runs on ${deviceName} but the PD belongs to ${pd.device.name}`, { code: 'ERR_WRONG_DEVICE' })
    } else {
      const device = openDevice(deviceName)
      this.#owned.push(device)
      pd = device.allocPd()
    }
    this.pd = pd
    this.device = pd.device
    if (setup.cq !== undefined) {
      this.cq = instance(setup.cq, 'cq', CompletionQueue)
    } else {
      this.cq = this.device.createCq(setup.cqOptions)
      this.#owned.push(this.cq)
    }
    this.qp = new QueuePair(pd, { ...qpCaps(setup.qp), type: 'RC', sendCq: this.cq }, (options) => id.native.createQp(pd.handle, options))
    connectionOf.set(this.qp, this)
    this.qp.markState('INIT') // rdma_create_qp brings it to INIT; accept/connect take it on to RTS
    id.onUnexpected = (event) => this.#onEvent(event)
    this.#json = new JsonMessages(this.qp)
    if (setup.receiveJson) this.#json.postReceive()
  }

  get localAddress(): CmAddress | null { return this.#id.closed ? null : this.#id.native.localAddress() }
  get remoteAddress(): CmAddress | null { return this.#id.closed ? null : this.#id.native.peerAddress() }
  get closed(): boolean { return this.#closed }

  /**
   * Sends a JSON value as one message (the peer calls receiveJson()). Messages
   * go out in call order; each has a slot of its own until the device is done
   * with it. A call that timed out or was aborted may still be delivered.
   */
  sendJson(value: unknown, options: WaitOptions = {}): Promise<void> {
    return this.#json.send(value, waitOptions(options))
  }

  /** Receives a message sent with sendJson(): waiting calls get messages in the order they arrive. */
  receiveJson(options: WaitOptions = {}): Promise<unknown> {
    return this.#json.receive(waitOptions(options))
  }

  /** @internal the connection is established */
  established(event: NativeCmEvent): void {
    this.qp.markState('RTS')
    this.privateData ??= event.privateData
  }

  #onEvent(event: NativeCmEvent): void {
    if (event.type === 'DISCONNECTED' || event.type === 'DEVICE_REMOVAL') {
      // Answer the peer's disconnect (DREP) at once, so its disconnect() completes.
      try { this.#id.native.disconnect() } catch { /* already disconnected */ }
      this.#markDisconnected()
      this.emit('disconnected', event.type)
    }
  }

  #markDisconnected(): void {
    if (this.#disconnected) return
    this.#disconnected = true
    // New requests are refused with ECONNRESET as the cause; moving the QP to
    // the error state flushes the pending ones (rdma_cm leaves the QP alone
    // when the peer disconnects).
    this.qp.failed(new RdmaError('The connection was disconnected', { code: 'ECONNRESET', qpn: this.qp.qpn }))
    if (!this.qp.closed) {
      try { this.qp.modify('ERR') } catch { /* already in error */ }
    }
  }

  /** Disconnects (both sides see 'disconnected'), then closes. Concurrent calls share one disconnect. */
  disconnect(options: WaitOptions = {}): Promise<void> {
    if (this.#closed) return Promise.resolve()
    let wait: WaitOptions
    try {
      wait = waitOptions(options)
    } catch (error) {
      return Promise.reject(error)
    }
    this.#disconnecting ??= this.#disconnect(wait)
    return this.#disconnecting
  }

  async #disconnect(wait: WaitOptions): Promise<void> {
    // With the port down the DREQ could not leave, and trying breaks rxe's rdma_cm:
    // close() destroys the id (sending the DREQ) once the port is back.
    if (!this.#disconnected && this.#id.portActive) {
      try {
        await this.#id.step('disconnect', () => this.#id.native.disconnect(), 'DISCONNECTED', { timeoutMs: wait.timeoutMs ?? 5000, ...(wait.signal ? { signal: wait.signal } : {}) })
      } catch {
        // the peer may be gone already; closing below is what matters
      }
      this.#markDisconnected()
    }
    this.close()
  }

  /** Releases the QP, the rdma_cm id and what the connection created. Idempotent. */
  close(): void {
    if (this.#closed) return
    this.#closed = true
    this.#markDisconnected()
    this.qp.close()
    this.#json.close()
    this.#id.close()
    for (const owned of this.#owned.reverse()) owned.close()
  }

  [Symbol.dispose](): void { this.close() }
}

function connParams(setup: ConnectionSetup, device: Device): [number, number] {
  const attrs = device.query()
  const responder = integer(setup.responderResources ?? Math.min(16, attrs.maxQpRdAtom), 'responderResources', 0, 255)
  const initiator = integer(setup.initiatorDepth ?? Math.min(16, attrs.maxQpInitRdAtom), 'initiatorDepth', 0, 255)
  return [responder, initiator]
}

/** options.ackTimeout checked: the exponent of the QP's local ACK timeout, or undefined (rdma_cm's). */
function ackTimeoutOf(value: unknown): number | undefined {
  return value === undefined ? undefined : integer(value, 'options.ackTimeout', 0, 31)
}

function hook(value: unknown, name: string): ((qp: QueuePair) => void) | undefined {
  if (value === undefined) return undefined
  if (typeof value !== 'function') throw typeError('a function', name, value)
  return value as (qp: QueuePair) => void
}

function privateData(value: unknown, name: string, max: number): Uint8Array | undefined {
  if (value === undefined) return undefined
  if (!(value instanceof Uint8Array)) throw typeError('a Buffer or Uint8Array', name, value)
  if (value.length > max) throw rangeError(`at most ${max} bytes`, `${name}.length`, value.length)
  return value
}

// The kernel's address resolution (rdma_resolve_ip, Linux 6.1) can miss a neighbour entry that
// becomes valid between its first lookup and queueing the request: an ARP answered at once, as
// after a link flap emptied the neighbour table. It then waits out the whole timeout it was given,
// with the neighbour REACHABLE. So each attempt gets at most ADDR_ATTEMPT_MS, and an attempt that
// timed out is tried again until the caller's deadline.
const ADDR_ATTEMPT_MS = 1000
const ETIMEDOUT = 110

/** `wait`: the caller's whole bound (its timeoutMs ends at `deadline`) and signal. */
async function resolveAddress(id: CmIdHandle, host: string, port: number, wait: WaitOptions, deadline: number): Promise<void> {
  for (;;) {
    const remainingMs = Math.max(1, deadline - Date.now())
    const attemptMs = Math.min(ADDR_ATTEMPT_MS, remainingMs)
    try {
      await id.step('resolve address', () => id.native.resolveAddr(host, port, attemptMs), 'ADDR_RESOLVED', { ...wait, timeoutMs: remainingMs })
      return
    } catch (error) {
      const kernelTimedOut = (error as RdmaError).code === 'ADDR_ERROR' && Math.abs((error as { cmStatus?: number }).cmStatus ?? 0) === ETIMEDOUT
      if (!kernelTimedOut) throw error
      if (Date.now() >= deadline) throw new RdmaError(`resolve address timed out after ${wait.timeoutMs} ms`, { code: 'ETIMEDOUT', verb: 'resolve address', cause: error })
    }
  }
}

/** Connects to a listener: resolves the address and route, sets up an RC QP, and connects. */
export async function connect(options: ConnectionOptions): Promise<Connection> {
  const o = object(options, 'options')
  const port = integer(o.port, 'options.port', 1, 65535)
  const wait = waitOptions({ timeoutMs: o.timeoutMs ?? DEFAULT_TIMEOUT, signal: o.signal })
  const data = privateData(o.privateData, 'options.privateData', 56)
  const ackTimeout = ackTimeoutOf(o.ackTimeout)
  const deadline = Date.now() + wait.timeoutMs!
  const left = () => ({ ...wait, timeoutMs: Math.max(1, deadline - Date.now()) })
  const host = await numericHost(o.host, 'options.host', left())
  const id = channel().createId()
  let connection: Connection | undefined
  try {
    await resolveAddress(id, host, port, wait, deadline)
    await id.step('resolve route', () => id.native.resolveRoute(Math.max(1, deadline - Date.now())), 'ROUTE_RESOLVED', left())
    connection = new Connection(id, o as ConnectionSetup, undefined)
    hook(o.beforeConnect, 'options.beforeConnect')?.(connection.qp)
    const [responder, initiator] = connParams(o as ConnectionSetup, connection.device)
    if (ackTimeout !== undefined) call(() => id.native.setAckTimeout(ackTimeout))
    const event = await id.step('connect', () => id.native.connect(data, responder, initiator, 7, 7), 'ESTABLISHED', left())
    connection.established(event)
    return connection
  } catch (error) {
    if (connection) connection.close()
    else id.close()
    throw error
  }
}

/** An incoming connection request: accept() or reject() it. */
export class ConnectionRequest {
  readonly privateData: Buffer | undefined
  #answered = false

  /** Not constructible: made by a Listener. */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(listener: Listener, id: CmIdHandle, event: NativeCmEvent)
  constructor(readonly listener: Listener, /** @internal */ readonly id: CmIdHandle, event: NativeCmEvent) {
    this.privateData = event.privateData
  }

  get remoteAddress(): CmAddress | null { return this.id.native.peerAddress() }

  /** Accepts: sets up the QP (posting receiveJson's receive first if asked) and waits for ESTABLISHED. */
  async accept(options: AcceptOptions = {}): Promise<Connection> {
    if (this.#answered) throw new RdmaError('This request was already answered', { code: 'ERR_ANSWERED' })
    this.#answered = true
    const o = optionalObject(options, 'options') as AcceptOptions
    let connection: Connection | undefined
    try {
      const wait = waitOptions({ timeoutMs: o.timeoutMs ?? DEFAULT_TIMEOUT, signal: o.signal })
      const data = privateData(o.privateData, 'options.privateData', 196)
      const ackTimeout = ackTimeoutOf(o.ackTimeout)
      connection = new Connection(this.id, o, this.listener.pd)
      // Receives posted here are in place before the peer can send (it may send as soon as it sees ESTABLISHED).
      hook(o.beforeAccept, 'options.beforeAccept')?.(connection.qp)
      const [responder, initiator] = connParams(o, connection.device)
      if (ackTimeout !== undefined) call(() => this.id.native.setAckTimeout(ackTimeout))
      const event = await this.id.step('accept', () => this.id.native.accept(data, responder, initiator, 7, 7), 'ESTABLISHED', wait)
      connection.established(event)
      connection.privateData = this.privateData
      return connection
    } catch (error) {
      if (connection) connection.close()
      else this.id.close()
      throw error
    }
  }

  /** Rejects, with up to 148 bytes the connecting side gets as error.privateData. */
  reject(options: RejectOptions = {}): void {
    if (this.#answered) throw new RdmaError('This request was already answered', { code: 'ERR_ANSWERED' })
    this.#answered = true
    const o = optionalObject(options, 'options')
    try {
      const data = privateData(o.privateData, 'options.privateData', 148)
      // With the port down, the REJ goes out when close() can destroy the id (without the private data).
      if (this.id.portActive) call(() => this.id.native.reject(data))
    } finally {
      this.id.close()
    }
  }
}

/** A listening rdma_cm id: iterate it (for await) or listen to 'request' events. */
/** Typed listener methods (the rest of EventEmitter is Node's). */
export interface Listener {
  on<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this
  once<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this
  off<E extends keyof ListenerEvents>(event: E, listener: (...args: ListenerEvents[E]) => void): this
}

export class Listener extends EventEmitter implements AsyncIterable<ConnectionRequest> {
  readonly pd: ProtectionDomain | undefined
  readonly #id: CmIdHandle
  readonly #queue: ConnectionRequest[] = []
  readonly #takers: Array<(result: IteratorResult<ConnectionRequest>) => void> = []
  #closed = false

  /** Not constructible: made by listen(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(id: CmIdHandle, pd: ProtectionDomain | undefined)
  constructor(id: CmIdHandle, pd: ProtectionDomain | undefined) {
    super()
    this.#id = id
    this.pd = pd
    channel().addListener(id.key, this)
    channel().hold(id)
  }

  /** The bound address (the port is real even when 0 was asked for). */
  get address(): CmAddress | null { return this.#closed ? null : this.#id.native.localAddress() }

  /** @internal */
  push(request: ConnectionRequest): void {
    if (this.listenerCount('request') > 0) return void this.emit('request', request)
    const taker = this.#takers.shift()
    if (taker) taker({ value: request, done: false })
    else this.#queue.push(request)
  }

  /** The next request (or undefined once closed). */
  async accept(): Promise<ConnectionRequest | undefined> {
    const next = await this[Symbol.asyncIterator]().next()
    return next.done ? undefined : next.value
  }

  [Symbol.asyncIterator](): AsyncIterator<ConnectionRequest> {
    return {
      next: () => {
        const queued = this.#queue.shift()
        if (queued) return Promise.resolve({ value: queued, done: false })
        if (this.#closed) return Promise.resolve({ value: undefined, done: true })
        return new Promise((resolve) => this.#takers.push(resolve))
      },
      return: () => {
        this.close()
        return Promise.resolve({ value: undefined, done: true })
      },
    }
  }

  /** Stops listening; requests not yet answered are rejected. */
  close(): void {
    if (this.#closed) return
    this.#closed = true
    channel().release(this.#id)
    for (const request of this.#queue.splice(0)) {
      try { request.reject() } catch { /* already gone */ }
    }
    for (const taker of this.#takers.splice(0)) taker({ value: undefined, done: true })
    this.#id.close()
  }

  [Symbol.dispose](): void { this.close() }
}

/** Listens for rdma_cm connections on an address of an RDMA device. */
export async function listen(options: ListenOptions): Promise<Listener> {
  const o = object(options, 'options')
  const port = integer(o.port, 'options.port', 0, 65535)
  const backlog = integer(o.backlog ?? 128, 'options.backlog', 1, 65535)
  const pd = o.pd === undefined ? undefined : instance(o.pd, 'options.pd', ProtectionDomain)
  const host = await numericHost(o.host, 'options.host')
  const id = channel().createId()
  id.listening = true
  try {
    call(() => id.native.bind(host, port))
    call(() => id.native.listen(backlog))
  } catch (error) {
    id.close()
    throw error
  }
  return new Listener(id, pd)
}

// --- memory descriptors in private data ---------------------------------------

const MAGIC = [0x4e, 0x49, 0x42] // 'NIB'
const ENTRY = 20

/** Packs remote descriptors into bytes for private data: 4 + 20 per descriptor (2 fit a connect request, 9 an accept). */
export function encodeDescriptors(descriptors: ReadonlyArray<{ addr: string; rkey: number; length: number }>): Buffer {
  if (!Array.isArray(descriptors)) throw typeError('an array of descriptors', 'descriptors', descriptors)
  const out = Buffer.alloc(4 + ENTRY * descriptors.length)
  out.set(MAGIC, 0)
  out[3] = descriptors.length
  descriptors.forEach((d, i) => {
    const at = 4 + i * ENTRY
    out.writeUInt32LE(integer(d.rkey, `descriptors[${i}].rkey`, 0, 0xffffffff), at)
    out.writeBigUInt64LE(BigInt(d.addr), at + 4)
    out.writeBigUInt64LE(BigInt(integer(d.length, `descriptors[${i}].length`, 0, Number.MAX_SAFE_INTEGER)), at + 12)
  })
  return out
}

/** Unpacks descriptors packed by encodeDescriptors (ignores the CM's zero padding). */
export function decodeDescriptors(bytes: Uint8Array | undefined): Array<{ version: 1; addr: string; rkey: number; length: number }> {
  if (!(bytes instanceof Uint8Array)) throw typeError('a Buffer', 'bytes', bytes)
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (b.length < 4 || b[0] !== MAGIC[0] || b[1] !== MAGIC[1] || b[2] !== MAGIC[2]) throw typeError('descriptors packed by encodeDescriptors', 'bytes', bytes)
  const count = b[3]!
  if (b.length < 4 + count * ENTRY) throw rangeError(`${4 + count * ENTRY} bytes for ${count} descriptors`, 'bytes.length', b.length)
  return Array.from({ length: count }, (_, i) => {
    const at = 4 + i * ENTRY
    return { version: 1 as const, rkey: b.readUInt32LE(at), addr: '0x' + b.readBigUInt64LE(at + 4).toString(16), length: Number(b.readBigUInt64LE(at + 12)) }
  })
}
