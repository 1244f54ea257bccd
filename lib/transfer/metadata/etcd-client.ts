// A small etcd v3 client over the JSON gateway that every etcd 3.4+ serves on
// its client port (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/lease/*,
// /v3/watch), on node:http alone. It does only what the registry needs, and
// every call has a bound: a dead or partitioned etcd is an
// ERR_METADATA_UNAVAILABLE within `timeoutMs`, never a hang. Keys and values
// are base64 in the gateway's JSON, int64s are decimal strings.
import { request, Agent, type IncomingMessage } from 'node:http'
import { RdmaError } from '../../core/errors.js'

export interface EtcdEndpoint { host: string; port: number }

/** One key as etcd returns it. */
export interface EtcdKeyValue { key: string; value: string; modRevision: number; createRevision: number; lease: string }

export interface EtcdWatchEvent { type: 'PUT' | 'DELETE'; kv: EtcdKeyValue; prev: EtcdKeyValue | undefined }

/** What a watch stream reports. */
export interface EtcdWatchHandlers {
  /** The watch was created: events from `startRevision` on follow. */
  created(): void
  events(events: EtcdWatchEvent[], revision: number): void
  /** The stream ended (etcd went away, the watch was canceled or compacted): list again and watch anew. */
  ended(error: RdmaError): void
}

export interface EtcdWatch { cancel(): void }

/** etcd's gRPC status codes that mean "try again later / elsewhere". */
const UNAVAILABLE_GRPC = new Set([4, 14]) // DEADLINE_EXCEEDED, UNAVAILABLE

interface RawKv { key?: string; value?: string; mod_revision?: string; create_revision?: string; lease?: string }
interface Header { revision?: string }

const b64 = (text: string): string => Buffer.from(text).toString('base64')
const unb64 = (text: string | undefined): string => Buffer.from(text ?? '', 'base64').toString()

function kv(raw: RawKv): EtcdKeyValue {
  return { key: unb64(raw.key), value: unb64(raw.value), modRevision: Number(raw.mod_revision ?? 0), createRevision: Number(raw.create_revision ?? 0), lease: raw.lease ?? '0' }
}

/** The first key after every key that starts with `prefix` (etcd's range_end for a prefix), in base64. */
export function prefixEnd(prefix: string): string {
  const bytes = Buffer.from(prefix)
  for (let i = bytes.length - 1; i >= 0; i--) {
    if (bytes[i]! < 0xff) return Buffer.concat([bytes.subarray(0, i), Buffer.from([bytes[i]! + 1])]).toString('base64')
  }
  return Buffer.from([0]).toString('base64') // all 0xff: every key from `prefix` on
}

function unavailable(message: string, cause?: unknown): RdmaError {
  return new RdmaError(message, { code: 'ERR_METADATA_UNAVAILABLE', cause })
}

export class EtcdClient {
  readonly endpoints: readonly EtcdEndpoint[]
  readonly timeoutMs: number
  // Sockets kept between calls (one keep-alive per TTL/3 otherwise opens a connection each time).
  readonly #agent = new Agent({ keepAlive: true, maxSockets: 4 })
  readonly #watches = new Set<() => void>()
  /** The endpoint that answered last: calls start there. */
  #current = 0
  #closed = false

  constructor(endpoints: readonly EtcdEndpoint[], timeoutMs: number) {
    this.endpoints = endpoints
    this.timeoutMs = timeoutMs
  }

  /**
   * POSTs `body` to `path`, trying each endpoint in turn (starting with the
   * last that answered) until one answers or `timeoutMs` is spent. An answer
   * with an error status is an RdmaError ERR_METADATA (with etcd's message);
   * no answer at all is ERR_METADATA_UNAVAILABLE.
   */
  async call<T>(path: string, body: object, timeoutMs = this.timeoutMs): Promise<T> {
    if (this.#closed) throw new RdmaError('The metadata client was closed', { code: 'ERR_CLOSED' })
    const deadline = Date.now() + timeoutMs
    let last: unknown
    for (let tried = 0; tried < this.endpoints.length; tried++) {
      const left = deadline - Date.now()
      if (left <= 0) break
      const index = (this.#current + tried) % this.endpoints.length
      try {
        const result = await this.#post<T>(this.endpoints[index]!, path, body, left)
        this.#current = index
        return result
      } catch (error) {
        if ((error as RdmaError).code !== 'ERR_METADATA_UNAVAILABLE') throw error
        last = error
      }
    }
    const where = this.endpoints.map((e) => `${e.host}:${e.port}`).join(', ')
    throw unavailable(`etcd (${where}) did not answer ${path} within ${timeoutMs} ms: ${(last as Error | undefined)?.message ?? 'no time left'}`, last)
  }

  #post<T>(endpoint: EtcdEndpoint, path: string, body: object, timeoutMs: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const payload = JSON.stringify(body)
      let settled = false
      const settle = (action: () => void): void => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        action()
      }
      const req = request({ host: endpoint.host, port: endpoint.port, path, method: 'POST', agent: this.#agent,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
        readBody(res).then((text) => settle(() => {
          let parsed: { error?: string; message?: string; code?: number } & Record<string, unknown>
          try {
            parsed = JSON.parse(text) as typeof parsed
          } catch {
            return reject(unavailable(`etcd at ${endpoint.host}:${endpoint.port} answered ${path} with status ${res.statusCode} and no JSON`))
          }
          if (res.statusCode === 200 && parsed.error === undefined) return resolve(parsed as T)
          const message = `etcd: ${parsed.message ?? parsed.error ?? `status ${res.statusCode}`} (${path})`
          if (UNAVAILABLE_GRPC.has(Number(parsed.code)) || (res.statusCode ?? 500) >= 500 && parsed.code === undefined) return reject(unavailable(message))
          reject(Object.assign(new RdmaError(message, { code: 'ERR_METADATA' }), { grpcCode: parsed.code }))
        }), (error: unknown) => settle(() => reject(unavailable(`etcd at ${endpoint.host}:${endpoint.port}: ${(error as Error).message}`, error))))
      })
      const timer = setTimeout(() => settle(() => {
        req.destroy()
        reject(unavailable(`etcd at ${endpoint.host}:${endpoint.port} did not answer within ${timeoutMs} ms`))
      }), timeoutMs)
      req.on('error', (error) => settle(() => reject(unavailable(`etcd at ${endpoint.host}:${endpoint.port}: ${error.message}`, error))))
      req.end(payload)
    })
  }

  // --- keys ------------------------------------------------------------------

  /** The keys that start with `prefix` (or the one key, with `exact`), and the store's revision they are read at. */
  async range(key: string, options: { prefix?: boolean; timeoutMs?: number } = {}): Promise<{ kvs: EtcdKeyValue[]; revision: number }> {
    const body: Record<string, string> = { key: b64(key) }
    if (options.prefix) body.range_end = prefixEnd(key)
    const r = await this.call<{ header?: Header; kvs?: RawKv[] }>('/v3/kv/range', body, options.timeoutMs)
    return { kvs: (r.kvs ?? []).map(kv), revision: Number(r.header?.revision ?? 0) }
  }

  /** Puts `value` under `key`, attached to `lease`; the store's revision after the put (the key's mod revision). */
  async put(key: string, value: string, lease: string, timeoutMs?: number): Promise<number> {
    const r = await this.call<{ header?: Header }>('/v3/kv/put', { key: b64(key), value: b64(value), lease }, timeoutMs)
    return Number(r.header?.revision ?? 0)
  }

  /**
   * Puts `value` under `key` with `lease` only if the key's mod revision is
   * `modRevision` (0: only if the key does not exist). Returns whether it was
   * put (and the key's new mod revision), or the key as it is when it was not.
   */
  async putIf(key: string, value: string, lease: string, modRevision: number, timeoutMs?: number): Promise<{ put: boolean; revision: number; current: EtcdKeyValue | undefined }> {
    const compare = modRevision === 0
      ? { key: b64(key), target: 'CREATE', result: 'EQUAL', create_revision: '0' }
      : { key: b64(key), target: 'MOD', result: 'EQUAL', mod_revision: String(modRevision) }
    const r = await this.call<{ header?: Header; succeeded?: boolean; responses?: Array<{ response_range?: { kvs?: RawKv[] } }> }>('/v3/kv/txn', {
      compare: [compare],
      success: [{ request_put: { key: b64(key), value: b64(value), lease } }],
      failure: [{ request_range: { key: b64(key) } }],
    }, timeoutMs)
    const revision = Number(r.header?.revision ?? 0)
    if (r.succeeded) return { put: true, revision, current: undefined }
    const raw = r.responses?.[0]?.response_range?.kvs?.[0]
    return { put: false, revision, current: raw ? kv(raw) : undefined }
  }

  // --- leases ----------------------------------------------------------------

  /** A new lease of `ttlSeconds`; its id (a decimal string). */
  async grant(ttlSeconds: number, timeoutMs?: number): Promise<string> {
    const r = await this.call<{ ID?: string; TTL?: string }>('/v3/lease/grant', { TTL: ttlSeconds }, timeoutMs)
    if (!r.ID) throw new RdmaError('etcd granted no lease', { code: 'ERR_METADATA' })
    return r.ID
  }

  /** Refreshes the lease; false when etcd no longer has it (expired or lost). */
  async keepAlive(lease: string, timeoutMs?: number): Promise<boolean> {
    const r = await this.call<{ result?: { TTL?: string } }>('/v3/lease/keepalive', { ID: lease }, timeoutMs)
    return Number(r.result?.TTL ?? 0) > 0
  }

  /** Revokes the lease (its keys go at once); a lease etcd no longer has counts as revoked. */
  async revoke(lease: string, timeoutMs?: number): Promise<void> {
    try {
      await this.call('/v3/lease/revoke', { ID: lease }, timeoutMs)
    } catch (error) {
      if ((error as { grpcCode?: number }).grpcCode !== 5) throw error // NOT_FOUND: gone already
    }
  }

  // --- watches ---------------------------------------------------------------

  /**
   * Watches the keys under `prefix` from `startRevision` on, over one
   * streaming POST to the endpoint that answered last. The stream stays open
   * until cancel(), or until it ends (etcd went away, the watch was canceled
   * or compacted), which `ended` reports once.
   */
  watch(prefix: string, startRevision: number, handlers: EtcdWatchHandlers): EtcdWatch {
    const endpoint = this.endpoints[this.#current]!
    const where = `etcd at ${endpoint.host}:${endpoint.port}`
    let done = false
    let created = false
    let req: ReturnType<typeof request> | undefined
    // A watch whose stream does not even start ends within the call bound.
    const startTimer = setTimeout(() => end(unavailable(`${where} did not start the watch within ${this.timeoutMs} ms`)), this.timeoutMs)
    const stop = (): boolean => {
      if (done) return false
      done = true
      clearTimeout(startTimer)
      this.#watches.delete(cancel)
      req?.destroy()
      return true
    }
    const end = (error: RdmaError): void => { if (stop()) handlers.ended(error) }
    const cancel = (): void => { stop() }
    const onCreated = (): void => {
      created = true
      clearTimeout(startTimer)
      handlers.created()
    }
    if (this.#closed) {
      queueMicrotask(() => end(new RdmaError('The metadata client was closed', { code: 'ERR_CLOSED' })))
      return { cancel }
    }
    this.#watches.add(cancel)
    const payload = JSON.stringify({ create_request: { key: b64(prefix), range_end: prefixEnd(prefix), start_revision: String(startRevision), prev_kv: true } })
    // Its own connection (agent: false): a stream that lives for hours has no place in the call pool.
    req = request({ host: endpoint.host, port: endpoint.port, path: '/v3/watch', method: 'POST', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      if (res.statusCode !== 200) {
        res.resume()
        return end(unavailable(`${where} refused the watch (status ${res.statusCode})`))
      }
      let buffered = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => {
        buffered += chunk
        let nl: number
        while (!done && (nl = buffered.indexOf('\n')) >= 0) {
          const line = buffered.slice(0, nl).trim()
          buffered = buffered.slice(nl + 1)
          if (line) this.#onWatchLine(line, created ? handlers : { ...handlers, created: onCreated }, end)
        }
      })
      res.on('end', () => end(unavailable(`${where} closed the watch stream`)))
      res.on('error', (error) => end(unavailable(`the watch stream from ${where} failed: ${error.message}`, error)))
    })
    req.on('error', (error) => end(unavailable(`${where}: ${error.message}`, error)))
    req.end(payload)
    return { cancel }
  }

  #onWatchLine(line: string, handlers: EtcdWatchHandlers, end: (error: RdmaError) => void): void {
    let message: { result?: { header?: Header; created?: boolean; canceled?: boolean; compact_revision?: string; cancel_reason?: string; events?: Array<{ type?: string; kv?: RawKv; prev_kv?: RawKv }> }; error?: { message?: string } }
    try {
      message = JSON.parse(line) as typeof message
    } catch {
      return end(unavailable(`etcd sent a watch line that is not JSON: ${line.slice(0, 80)}`))
    }
    const result = message.result
    if (!result) return end(unavailable(`the watch failed: ${message.error?.message ?? line.slice(0, 80)}`))
    if (result.canceled) {
      const why = result.compact_revision ? `compacted at revision ${result.compact_revision}` : result.cancel_reason ?? 'canceled'
      return end(new RdmaError(`etcd ended the watch (${why})`, { code: 'ERR_METADATA_UNAVAILABLE' }))
    }
    if (result.created) handlers.created()
    if (result.events?.length) {
      handlers.events(result.events.map((e) => ({ type: e.type === 'DELETE' ? 'DELETE' : 'PUT', kv: kv(e.kv ?? {}), prev: e.prev_kv ? kv(e.prev_kv) : undefined })),
        Number(result.header?.revision ?? 0))
    }
  }

  /** Cancels every watch and drops the kept sockets. */
  close(): void {
    this.#closed = true
    for (const cancel of [...this.#watches]) cancel()
    this.#agent.destroy()
  }
}

function readBody(res: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = ''
    res.setEncoding('utf8')
    res.on('data', (chunk: string) => { text += chunk })
    res.on('end', () => resolve(text))
    res.on('error', reject)
    res.on('aborted', () => reject(new Error('the answer was cut off')))
  })
}
