// An rdma_cm connection: its QP, JSON messages, disconnect; and connect().
import { EventEmitter } from 'node:events'
import { type NativeCmEvent } from '../native/addon.js'
import { call, RdmaError } from '../core/errors.js'
import { integer, instance, object, optionalObject, rangeError, typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import { openDevice, type Device } from '../verbs/device.js'
import { ProtectionDomain } from '../verbs/protection-domain.js'
import { CompletionQueue } from '../verbs/completion-queue.js'
import { QueuePair } from '../verbs/queue-pair.js'
import type { CmAddress, ConnectionEvents, ConnectionOptions, ConnectionSetup, QpCaps } from './options.js'
import { CAP_FIELDS, CmIdHandle, DEFAULT_TIMEOUT, channel, numericHost } from './channel.js'
import { JsonMessages } from './json-messages.js'

/** A connection stays reachable from its QP: whoever holds conn.qp still gets 'disconnected' handled. */
const connectionOf = new WeakMap<QueuePair, Connection>()

/** Only the capacity fields of options.qp: the type and the CQs are the connection's own. */
function qpCaps(value: unknown): QpCaps {
  const o = optionalObject(value, 'options.qp')
  const caps: Record<string, unknown> = {}
  for (const field of CAP_FIELDS) if (o[field] !== undefined) caps[field] = o[field]
  return caps as QpCaps
}

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
    let pd = pdFor(setup.pd ?? fallbackPd, deviceName)
    const caps = qpCaps(setup.qp)
    // What this constructor opened is closed again if a later step throws (the caller closes only the id).
    try {
      if (pd === undefined) {
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
      const qpPd = pd
      this.qp = new QueuePair(qpPd, { ...caps, type: 'RC', sendCq: this.cq }, (options) => id.native.createQp(qpPd.handle, options))
    } catch (error) {
      for (const owned of this.#owned.reverse()) try { owned.close() } catch { /* the first error is the one to report */ }
      throw error
    }
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
    if (event.type === 'DEVICE_REMOVAL') return this.#deviceRemoved(event)
    if (event.type === 'DISCONNECTED') {
      // Answer the peer's disconnect (DREP) at once, so its disconnect() completes.
      try { this.#id.native.disconnect() } catch { /* already disconnected */ }
      this.#markDisconnected()
      this.emit('disconnected', event.type)
    }
  }

  // The device is gone: requests fail with ERR_DEVICE_REMOVED, 'disconnected'
  // handlers see the QP in error, then everything the connection made on the
  // device is released (the channel destroys the id after this returns).
  #deviceRemoved(event: NativeCmEvent): void {
    // A connection the peer disconnected first (its DREQ can come before our
    // DEVICE_REMOVAL) said 'disconnected' already: once per connection.
    const told = this.#disconnected
    this.#markDisconnected(new RdmaError('The RDMA device was removed (rdma_cm DEVICE_REMOVAL)', { code: 'ERR_DEVICE_REMOVED', status: event.type, qpn: this.qp.qpn }))
    try {
      if (!told) this.emit('disconnected', event.type)
    } finally {
      this.close()
    }
  }

  #markDisconnected(cause?: RdmaError): void {
    if (this.#disconnected) return
    this.#disconnected = true
    // New requests are refused with ECONNRESET as the cause; moving the QP to
    // the error state flushes the pending ones (rdma_cm leaves the QP alone
    // when the peer disconnects).
    this.qp.failed(cause ?? new RdmaError('The connection was disconnected', { code: 'ECONNRESET', qpn: this.qp.qpn }))
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

/** The PD given (or, of several, the one of `deviceName`), checked to belong to the device the connection runs on. */
function pdFor(given: ProtectionDomain | readonly ProtectionDomain[] | undefined, deviceName: string): ProtectionDomain | undefined {
  if (given === undefined) return undefined
  if (Array.isArray(given)) {
    if (given.length === 0) throw typeError('a ProtectionDomain or a non-empty list of them', 'pd', given)
    const pds = given.map((pd: unknown, i) => instance(pd, `pd[${i}]`, ProtectionDomain))
    const pd = pds.find((p) => p.device.name === deviceName)
    if (!pd) throw new RdmaError(`The connection runs on ${deviceName} but none of the PDs belongs to it (${pds.map((p) => p.device.name).join(', ')})`, { code: 'ERR_WRONG_DEVICE' })
    return pd
  }
  const pd = instance(given, 'pd', ProtectionDomain)
  if (pd.device.name !== deviceName) throw new RdmaError(`The connection runs on ${deviceName} but the PD belongs to ${pd.device.name}`, { code: 'ERR_WRONG_DEVICE' })
  return pd
}

export function connParams(setup: ConnectionSetup, device: Device): [number, number] {
  const attrs = device.query()
  const responder = integer(setup.responderResources ?? Math.min(16, attrs.maxQpRdAtom), 'responderResources', 0, 255)
  const initiator = integer(setup.initiatorDepth ?? Math.min(16, attrs.maxQpInitRdAtom), 'initiatorDepth', 0, 255)
  return [responder, initiator]
}

/**
 * The options that need no device checked before anything is created, so a
 * bad argument is refused with its own code whatever the state of the
 * devices (a closed PD's ERR_CLOSED would otherwise come first).
 */
export function checkSetup(setup: ConnectionSetup, hookName: 'beforeAccept' | 'beforeConnect'): ((qp: QueuePair) => void) | undefined {
  if (setup.responderResources !== undefined) integer(setup.responderResources, 'responderResources', 0, 255)
  if (setup.initiatorDepth !== undefined) integer(setup.initiatorDepth, 'initiatorDepth', 0, 255)
  qpCaps(setup.qp)
  return hook((setup as Record<string, unknown>)[hookName], `options.${hookName}`)
}

/** options.ackTimeout checked: the exponent of the QP's local ACK timeout, or undefined (rdma_cm's). */
export function ackTimeoutOf(value: unknown): number | undefined {
  return value === undefined ? undefined : integer(value, 'options.ackTimeout', 0, 31)
}

export function hook(value: unknown, name: string): ((qp: QueuePair) => void) | undefined {
  if (value === undefined) return undefined
  if (typeof value !== 'function') throw typeError('a function', name, value)
  return value as (qp: QueuePair) => void
}

export function privateData(value: unknown, name: string, max: number): Uint8Array<ArrayBuffer> | undefined {
  if (value === undefined) return undefined
  if (!(value instanceof Uint8Array)) throw typeError('a Buffer or Uint8Array', name, value)
  // The addon reads it through napi_get_arraybuffer_info, which refuses a SharedArrayBuffer
  // with an uncoded "Invalid argument".
  if (!(value.buffer instanceof ArrayBuffer)) throw typeError('an ArrayBuffer-backed Buffer or Uint8Array', name, value)
  if (value.length > max) throw rangeError(`at most ${max} bytes`, `${name}.length`, value.length)
  return value as Uint8Array<ArrayBuffer>
}

// The kernel's address resolution (rdma_resolve_ip, Linux 6.1) can miss a neighbour entry that
// becomes valid between its first lookup and queueing the request: an ARP answered at once, as
// after a link flap emptied the neighbour table. It then waits out the whole timeout it was given,
// with the neighbour REACHABLE. So each attempt gets at most ADDR_ATTEMPT_MS, and an attempt that
// timed out is tried again until the caller's deadline.
const ADDR_ATTEMPT_MS = 1000
export const ETIMEDOUT = 110

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
  const beforeConnect = checkSetup(o as ConnectionSetup, 'beforeConnect')
  const deadline = Date.now() + wait.timeoutMs!
  const left = () => ({ ...wait, timeoutMs: Math.max(1, deadline - Date.now()) })
  const host = await numericHost(o.host, 'options.host', left())
  const id = channel().createId()
  let connection: Connection | undefined
  try {
    await resolveAddress(id, host, port, wait, deadline)
    await id.step('resolve route', () => id.native.resolveRoute(Math.max(1, deadline - Date.now())), 'ROUTE_RESOLVED', left())
    connection = new Connection(id, o as ConnectionSetup, undefined)
    beforeConnect?.(connection.qp)
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
