// The rdma_cm event channel, watched on the event loop, and the ids whose
// steps wait on it; every wait is bounded.
import { isIP } from 'node:net'
import { lookup } from 'node:dns/promises'
import { native, type NativeCmEvent, type NativeCmEventChannel, type NativeCmId } from '../native/addon.js'
import { call, closedError, errnoName, RdmaError } from '../core/errors.js'
import type { RdmaErrorCode } from '../core/error-codes.js'
import { typeError, type WaitOptions } from '../core/validate.js'
import { deferDestroyWhilePortDown } from './deferred-destroy.js'
import { releaseRemovedDevice } from './removed-devices.js'

const EVENT_PREFIX = 'RDMA_CM_EVENT_'
export const DEFAULT_TIMEOUT = 10_000
export const JSON_BYTES = 4096
export const CAP_FIELDS = ['maxSendWr', 'maxRecvWr', 'maxSendSge', 'maxRecvSge', 'maxInlineData'] as const

function timedOut(verb: string, timeoutMs: number | undefined): RdmaError {
  return new RdmaError(`${verb} timed out after ${timeoutMs} ms`, { code: 'ETIMEDOUT', verb })
}

export function aborted(verb: string, signal: AbortSignal | undefined): RdmaError {
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
export class CmIdHandle {
  #waiter: Waiter | undefined
  onUnexpected: (event: NativeCmEvent) => void = () => {}
  closed = false
  /** A listening id sends nothing when destroyed, and must free its port at once. */
  listening = false
  /** Its device was removed (DEVICE_REMOVAL): it is destroyed at once, and librdmacm told. */
  removed = false
  removedDevice: string | null = null
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
    if (event.type === 'DEVICE_REMOVAL') return this.#deviceRemoved(event)
    const waiter = this.#waiter
    if (!waiter) return this.onUnexpected(event)
    if (event.type === waiter.success) waiter.resolve(event)
    else waiter.reject(eventError(event))
  }

  // rdma_get_cm_event(3): the id must be destroyed. The step waiting fails, the
  // owner (connection, listener) closes what it made on the device, then the id goes.
  #deviceRemoved(event: NativeCmEvent): void {
    this.removed = true
    try { this.removedDevice = this.native.deviceName() } catch { /* the id no longer names it */ }
    this.#waiter?.reject(eventError(event))
    try {
      this.onUnexpected(event)
    } finally {
      this.close()
    }
  }

  fail(error: Error): void {
    this.#waiter?.reject(error)
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    this.fail(closedError('Connection'))
    channel().forget(this.key)
    if (this.removed) {
      // No MAD can leave a removed device: destroyed now, then librdmacm may close its context.
      const device = this.removedDevice
      try { call(() => this.native.close()) } finally { releaseRemovedDevice(device) }
      return
    }
    if (this.listening || !deferDestroyWhilePortDown(this.native)) call(() => this.native.close())
  }

  /** A MAD sent while the port is down breaks rdma_cm on rxe (cm-deferred-destroy.ts). */
  get portActive(): boolean {
    return this.closed || this.native.portActive()
  }
}

export function eventError(event: NativeCmEvent): RdmaError {
  const details = { privateData: event.privateData, cmStatus: event.status }
  const make = (code: RdmaErrorCode, message: string) => Object.assign(new RdmaError(message, { code, status: event.type }), details)
  switch (event.type) {
    case 'REJECTED': return make('ECONNREFUSED', `Connection rejected (status ${event.status}${event.privateData ? ', with private data' : ''})`)
    case 'UNREACHABLE': return make('EHOSTUNREACH', `Peer unreachable (status ${event.status})`)
    case 'ADDR_ERROR': return make('ADDR_ERROR', `Address resolution failed (status ${event.status})`)
    case 'ROUTE_ERROR': return make('ROUTE_ERROR', `Route resolution failed (status ${event.status})`)
    case 'CONNECT_ERROR': return make('CONNECT_ERROR', `Connection failed (status ${event.status})`)
    case 'DISCONNECTED': return make('ECONNRESET', 'The peer disconnected')
    case 'DEVICE_REMOVAL': return make('ERR_DEVICE_REMOVED', 'The RDMA device was removed (rdma_cm DEVICE_REMOVAL)')
    default: return make('ERR_CM_EVENT', `Unexpected rdma_cm event ${event.type} (status ${event.status})`)
  }
}

/** A listening id's handler of an incoming connection request (its new id and the event). */
export type RequestHandler = (id: CmIdHandle, event: NativeCmEvent) => void

export class CmChannel {
  readonly handle: NativeCmEventChannel
  // Weak: a connection nobody references any more is collected with its id
  // (its native finalizer destroys the id). Ids with a step in progress and
  // listening ids are held in #pinned, so their promises can still settle.
  readonly #ids = new Map<number, WeakRef<CmIdHandle>>()
  readonly #collected = new FinalizationRegistry<number>((key) => {
    if (this.#ids.get(key)?.deref() === undefined) this.#ids.delete(key)
  })
  readonly #pinned = new Set<CmIdHandle>()
  /** Listening ids' handlers of CONNECT_REQUEST events (listener.ts makes the request objects). */
  readonly #listeners = new Map<number, RequestHandler>()
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

  addListener(key: number, onRequest: RequestHandler): void { this.#listeners.set(key, onRequest) }

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
      const onRequest = this.#listeners.get(event.listenKey)
      if (onRequest) onRequest(id, event)
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
export function channel(): CmChannel {
  sharedChannel ??= new CmChannel()
  return sharedChannel
}

/** The host as a numeric address: names are looked up (getaddrinfo) within `wait`. */
export async function numericHost(host: unknown, name: string, wait: WaitOptions = {}): Promise<string> {
  if (typeof host !== 'string' || host.length === 0) throw typeError('a host name or IP address', name, host)
  if (isIP(host)) return host
  // getaddrinfo cannot be cancelled: on timeout or abort it finishes in the background, unheeded.
  return (await bounded(lookup(host), 'resolve name', wait)).address
}

