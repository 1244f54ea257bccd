// Listening for rdma_cm connections: requests to accept or reject.
import { EventEmitter } from 'node:events'
import { type NativeCmEvent } from '../native/addon.js'
import { call, RdmaError } from '../core/errors.js'
import { integer, instance, object, optionalObject, waitOptions } from '../core/validate.js'
import { ProtectionDomain } from '../verbs/protection-domain.js'
import type { AcceptOptions, CmAddress, ListenOptions, ListenerEvents, RejectOptions } from './options.js'
import { CmIdHandle, DEFAULT_TIMEOUT, channel, numericHost } from './channel.js'
import { Connection, ackTimeoutOf, checkSetup, connParams, privateData } from './connection.js'

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
    if (this.id.removed) throw new RdmaError('The RDMA device of this request was removed (rdma_cm DEVICE_REMOVAL)', { code: 'ERR_DEVICE_REMOVED', status: 'DEVICE_REMOVAL' })
    const o = optionalObject(options, 'options') as AcceptOptions
    let connection: Connection | undefined
    try {
      const wait = waitOptions({ timeoutMs: o.timeoutMs ?? DEFAULT_TIMEOUT, signal: o.signal })
      const data = privateData(o.privateData, 'options.privateData', 196)
      const ackTimeout = ackTimeoutOf(o.ackTimeout)
      const beforeAccept = checkSetup(o, 'beforeAccept')
      connection = new Connection(this.id, o, this.listener.pd)
      // Receives posted here are in place before the peer can send (it may send as soon as it sees ESTABLISHED).
      beforeAccept?.(connection.qp)
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
  readonly #takers: Array<{ resolve: (result: IteratorResult<ConnectionRequest>) => void; reject: (error: Error) => void }> = []
  #closed = false
  #error: RdmaError | undefined

  /** Not constructible: made by listen(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(id: CmIdHandle, pd: ProtectionDomain | undefined)
  constructor(id: CmIdHandle, pd: ProtectionDomain | undefined) {
    super()
    this.#id = id
    this.pd = pd
    channel().addListener(id.key, (requestId, event) => this.push(new ConnectionRequest(this, requestId, event)))
    id.onUnexpected = (event) => {
      if (event.type === 'DEVICE_REMOVAL') this.#close(new RdmaError('The listener\'s RDMA device was removed (rdma_cm DEVICE_REMOVAL): it is closed', { code: 'ERR_DEVICE_REMOVED', status: event.type }))
    }
    channel().hold(id)
  }

  /** Why the listener closed by itself (its device was removed: ERR_DEVICE_REMOVED), or undefined. */
  get error(): RdmaError | undefined { return this.#error }

  /** The bound address (the port is real even when 0 was asked for). */
  get address(): CmAddress | null { return this.#closed ? null : this.#id.native.localAddress() }

  /** @internal */
  push(request: ConnectionRequest): void {
    if (this.listenerCount('request') > 0) return void this.emit('request', request)
    const taker = this.#takers.shift()
    if (taker) taker.resolve({ value: request, done: false })
    else this.#queue.push(request)
  }

  /** The next request (or undefined once closed; rejects with ERR_DEVICE_REMOVED once its device was removed). */
  async accept(): Promise<ConnectionRequest | undefined> {
    const next = await this[Symbol.asyncIterator]().next()
    return next.done ? undefined : next.value
  }

  [Symbol.asyncIterator](): AsyncIterator<ConnectionRequest> {
    return {
      next: () => {
        const queued = this.#queue.shift()
        if (queued) return Promise.resolve({ value: queued, done: false })
        if (this.#error) return Promise.reject(this.#error)
        if (this.#closed) return Promise.resolve({ value: undefined, done: true })
        return new Promise((resolve, reject) => this.#takers.push({ resolve, reject }))
      },
      return: () => {
        this.close()
        return Promise.resolve({ value: undefined, done: true })
      },
    }
  }

  /** Stops listening; requests not yet answered are rejected. Emits 'closed'. */
  close(): void {
    this.#close(undefined)
  }

  // `error`: the device was removed. The channel destroys the id after this returns.
  #close(error: RdmaError | undefined): void {
    if (this.#closed) return
    this.#closed = true
    this.#error = error
    channel().release(this.#id)
    for (const request of this.#queue.splice(0)) {
      try { request.reject() } catch { /* already gone */ }
    }
    for (const taker of this.#takers.splice(0)) {
      if (error) taker.reject(error)
      else taker.resolve({ value: undefined, done: true })
    }
    this.#id.close()
    this.emit('closed', error)
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
