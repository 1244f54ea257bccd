// Cluster membership on etcd: this agent's record under
// <prefix>agents/<name>, held by a lease it keeps alive (TTL/3), and the view
// of every other agent's record, kept by listing the prefix and then watching
// it from the listed revision on.
//
// When etcd is down or cut off, nothing here fails the agent: keep-alives and
// the watch retry every second, the view keeps what it had (lookups of names
// it does not know fail with ERR_METADATA_UNAVAILABLE), and once etcd answers
// again the lease is refreshed or, if etcd lost it (expired, or etcd came back
// without its data), a new lease is taken and the record put again — unless
// another incarnation has taken the name meanwhile ('displaced').
import { RdmaError } from '../../core/errors.js'
import { typeError } from '../../core/validate.js'
import { EtcdClient, type EtcdKeyValue, type EtcdWatch, type EtcdWatchEvent } from './etcd-client.js'
import type { MetadataSettings } from './options.js'
import { decodeRecord, encodeRecord, isAgentName, NAME_RULE, type PeerAddress, type PeerRecord } from './record.js'

/**
 * Where this agent stands with etcd: 'registered' (its record is there, its
 * lease refreshed), 'unavailable' (etcd does not answer; retrying),
 * 'displaced' (another incarnation registered under this name; this agent no
 * longer publishes), 'closed'.
 */
export type MetadataState = 'registered' | 'unavailable' | 'displaced' | 'closed'

/**
 * Why a peer left the view: 'deleted' (its key went: its lease expired or it
 * closed), 'replaced' (a new incarnation took its name: it restarted),
 * 'missing' (absent when the view was listed again after a lost watch, and
 * not back within its TTL).
 */
export type PeerLeftReason = 'deleted' | 'replaced' | 'missing'

export interface PeerLeftEvent { record: PeerRecord; reason: PeerLeftReason }

export interface MetadataStateEvent {
  state: MetadataState
  /** Why etcd is unavailable, or who displaced this agent. */
  error?: RdmaError
}

/** What the registry tells its agent. */
export interface RegistryEvents {
  joined(record: PeerRecord): void
  left(event: PeerLeftEvent): void
  state(event: MetadataStateEvent): void
}

/** The agent as it publishes itself; read at every put. */
export interface SelfRecord {
  name: string
  incarnation: string
  addresses(): PeerAddress[]
  segmentsVersion(): number
}

/** Retries while etcd is away: often enough to be back within a second of it. */
const RETRY_MS = 1000

/** Grants before registration gives up on leases that expire before their put. */
const LEASE_ATTEMPTS = 3

/** etcd refused a put because its lease is gone (gRPC NOT_FOUND, "requested lease not found"). */
function leaseNotFound(error: unknown): boolean {
  return (error as { grpcCode?: number }).grpcCode === 5 && /lease not found/.test((error as Error).message)
}

export class EtcdRegistry {
  readonly settings: MetadataSettings
  readonly #client: EtcdClient
  readonly #self: SelfRecord
  readonly #events: RegistryEvents
  readonly #agentsPrefix: string
  readonly #key: string
  readonly #members = new Map<string, PeerRecord>()
  /** Members absent from a new listing: they have their TTL to show up again. */
  readonly #suspects = new Map<string, NodeJS.Timeout>()
  #state: MetadataState = 'unavailable'
  #lease: string | undefined
  #published: string | undefined
  #modRevision = 0
  #republishing = false
  #keepTimer: NodeJS.Timeout | undefined
  #syncTimer: NodeJS.Timeout | undefined
  #watch: EtcdWatch | undefined
  #syncing = false
  #closed = false

  private constructor(settings: MetadataSettings, self: SelfRecord, events: RegistryEvents) {
    this.settings = settings
    this.#client = new EtcdClient(settings.endpoints, settings.requestTimeoutMs)
    this.#self = self
    this.#events = events
    this.#agentsPrefix = `${settings.prefix}agents/`
    this.#key = this.#agentsPrefix + self.name
  }

  /**
   * Registers `self` (taking over its name from an earlier incarnation) and
   * lists the cluster, each step within settings.requestTimeoutMs; then keeps
   * both up. Rejects with ERR_METADATA_UNAVAILABLE when etcd does not answer.
   */
  static async open(settings: MetadataSettings, self: SelfRecord, events: RegistryEvents): Promise<EtcdRegistry> {
    if (!isAgentName(self.name)) throw typeError(`${NAME_RULE} (it is the agent's key in etcd)`, 'options.name', self.name)
    const registry = new EtcdRegistry(settings, self, events)
    try {
      await registry.#register(true)
      registry.#state = 'registered'
      const listed = await registry.#client.range(registry.#agentsPrefix, { prefix: true })
      registry.#applyListing(listed.kvs, true)
      registry.#watchFrom(listed.revision + 1)
      registry.#scheduleKeepAlive(registry.#interval())
      return registry
    } catch (error) {
      await registry.close()
      throw error
    }
  }

  get state(): MetadataState { return this.#state }

  /** The other agents as the view has them now, by name. */
  members(): Map<string, PeerRecord> { return new Map(this.#members) }

  /**
   * The record of the agent named `name`: from the view, else read from etcd
   * within `timeoutMs` (at most the request bound). ERR_PEER_UNKNOWN when no
   * agent has that name, ERR_METADATA_UNAVAILABLE when etcd does not answer.
   */
  async lookup(name: string, timeoutMs: number): Promise<PeerRecord> {
    if (!isAgentName(name)) throw typeError(NAME_RULE, 'name', name)
    if (this.#closed) throw new RdmaError('The agent was closed', { code: 'ERR_CLOSED' })
    const known = this.#members.get(name)
    if (known) return known
    if (name === this.#self.name) throw new RdmaError(`'${name}' is this agent's own name`, { code: 'ERR_PEER_UNKNOWN' })
    let kvs: EtcdKeyValue[]
    try {
      ({ kvs } = await this.#client.range(this.#agentsPrefix + name, { timeoutMs: Math.max(1, Math.min(timeoutMs, this.settings.requestTimeoutMs)) }))
    } catch (error) {
      const e = error as RdmaError
      throw new RdmaError(`Cannot look up peer '${name}': ${e.message}`, { code: e.code ?? 'ERR_METADATA_UNAVAILABLE', cause: error })
    }
    const kv = kvs[0]
    if (!kv) throw new RdmaError(`No agent named '${name}' is registered under ${this.#agentsPrefix}`, { code: 'ERR_PEER_UNKNOWN' })
    const record = decodeRecord(kv.key, name, kv.value, kv.modRevision)
    if (record instanceof RdmaError) throw record
    return record
  }

  /** The record changed (its segment table version): put it again, one put at a time. */
  publish(): void {
    if (this.#republishing || this.#state !== 'registered' || this.#lease === undefined) return
    const value = this.#value()
    if (value === this.#published) return
    this.#republishing = true
    this.#client.putIf(this.#key, value, this.#lease, this.#modRevision).then((r) => {
      this.#republishing = false
      if (r.put) {
        this.#published = value
        this.#modRevision = r.revision
        this.publish() // changed again meanwhile?
      } else {
        this.#displaced(r.current)
      }
    }, () => {
      this.#republishing = false // the next keep-alive tick tries again (or re-registers)
    })
  }

  /** Stops refreshing and watching, and revokes the lease (the record goes at once) within the request bound. Never rejects. */
  async close(): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    this.#state = 'closed'
    clearTimeout(this.#keepTimer)
    clearTimeout(this.#syncTimer)
    for (const timer of this.#suspects.values()) clearTimeout(timer)
    this.#suspects.clear()
    this.#watch?.cancel()
    const lease = this.#lease
    this.#lease = undefined
    if (lease !== undefined) await this.#client.revoke(lease).catch(() => undefined) // displaced: no lease of ours holds the key
    this.#client.close()
  }

  // --- this agent's record ---------------------------------------------------

  #value(): string {
    return encodeRecord({ name: this.#self.name, incarnation: this.#self.incarnation, addresses: this.#self.addresses(), segmentsVersion: this.#self.segmentsVersion(), ttlSeconds: this.settings.ttlSeconds })
  }

  #interval(): number { return Math.max(200, Math.floor(this.settings.ttlSeconds * 1000 / 3)) }

  /**
   * A new lease and the record under it. At start (`takeOver`) the record
   * replaces whatever is there: a restarted agent takes its name back at
   * once. Later (etcd lost the lease) only a missing key or this
   * incarnation's own is overwritten. A lease that expired before the put
   * reached etcd (the process starved for longer than the TTL between the
   * two requests) is taken again, a few times.
   */
  async #register(takeOver: boolean): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#registerOnce(takeOver)
      } catch (error) {
        if (attempt >= LEASE_ATTEMPTS || !leaseNotFound(error)) throw error
      }
    }
  }

  async #registerOnce(takeOver: boolean): Promise<void> {
    const lease = await this.#client.grant(this.settings.ttlSeconds)
    try {
      const value = this.#value()
      let revision: number
      if (takeOver) {
        revision = await this.#client.put(this.#key, value, lease)
      } else {
        let r = await this.#client.putIf(this.#key, value, lease, 0)
        if (!r.put && r.current && this.#isMine(r.current)) r = await this.#client.putIf(this.#key, value, lease, r.current.modRevision)
        if (!r.put) throw this.#takenError(r.current)
        revision = r.revision
      }
      const old = this.#lease
      this.#lease = lease
      this.#published = value
      this.#modRevision = revision
      if (old !== undefined && old !== lease) this.#client.revoke(old).catch(() => undefined)
    } catch (error) {
      this.#client.revoke(lease).catch(() => undefined)
      throw error
    }
  }

  #isMine(kv: EtcdKeyValue): boolean {
    const record = decodeRecord(kv.key, this.#self.name, kv.value, kv.modRevision)
    return !(record instanceof RdmaError) && record.incarnation === this.#self.incarnation
  }

  #takenError(current: EtcdKeyValue | undefined): RdmaError {
    const record = current ? decodeRecord(current.key, this.#self.name, current.value, current.modRevision) : undefined
    const who = record instanceof RdmaError || record === undefined ? 'another writer' : `incarnation ${record.incarnation}`
    return new RdmaError(`The name '${this.#self.name}' was taken by ${who}; this agent no longer publishes itself`, { code: 'ERR_NAME_TAKEN' })
  }

  #displaced(current: EtcdKeyValue | undefined): void {
    if (this.#state === 'displaced' || this.#closed) return
    this.#lease = undefined // the key is another's now: never revoke it
    this.#setState('displaced', this.#takenError(current))
  }

  #setState(state: MetadataState, error?: RdmaError): void {
    if (this.#closed || this.#state === state) return
    const was = this.#state
    this.#state = state
    this.#events.state(error ? { state, error } : { state })
    // Back from an outage: the watch may have died without a word (a cut-off connection), so list and watch anew.
    if (state === 'registered' && was === 'unavailable') this.#restartWatch()
  }

  #scheduleKeepAlive(ms: number): void {
    if (this.#closed) return
    clearTimeout(this.#keepTimer)
    this.#keepTimer = setTimeout(() => { void this.#keepAlive() }, ms)
    this.#keepTimer.unref()
  }

  /** One keep-alive round: refresh the lease, or take a new one if etcd lost it. */
  async #keepAlive(): Promise<void> {
    if (this.#closed || this.#state === 'displaced') return
    try {
      const alive = this.#lease !== undefined && await this.#client.keepAlive(this.#lease)
      if (!alive) await this.#register(false)
      if (this.#closed) return
      this.#setState('registered')
      this.publish()
    } catch (error) {
      if (this.#closed) return
      const e = error as RdmaError
      if (e.code === 'ERR_NAME_TAKEN') {
        this.#lease = undefined
        this.#setState('displaced', e)
        return
      }
      this.#setState('unavailable', e instanceof RdmaError ? e : new RdmaError(String(error), { code: 'ERR_METADATA_UNAVAILABLE' }))
    }
    this.#scheduleKeepAlive(this.#state === 'registered' ? this.#interval() : Math.min(RETRY_MS, this.#interval()))
  }

  // --- the view of the others -----------------------------------------------

  #restartWatch(): void {
    this.#watch?.cancel()
    this.#watch = undefined
    clearTimeout(this.#syncTimer)
    this.#sync()
  }

  /** Lists the prefix, then watches it from the listing's revision on; retried until it works. */
  #sync(): void {
    if (this.#closed || this.#syncing) return
    this.#syncing = true
    this.#client.range(this.#agentsPrefix, { prefix: true }).then(({ kvs, revision }) => {
      this.#syncing = false
      if (this.#closed) return
      this.#applyListing(kvs, false)
      this.#watchFrom(revision + 1)
    }, () => {
      this.#syncing = false
      this.#retrySync()
    })
  }

  #retrySync(): void {
    if (this.#closed) return
    clearTimeout(this.#syncTimer)
    this.#syncTimer = setTimeout(() => this.#sync(), RETRY_MS)
    this.#syncTimer.unref()
  }

  #watchFrom(revision: number): void {
    this.#watch?.cancel()
    this.#watch = this.#client.watch(this.#agentsPrefix, revision, {
      created: () => undefined,
      events: (events) => { for (const event of events) this.#onEvent(event) },
      ended: () => {
        this.#watch = undefined
        this.#retrySync()
      },
    })
  }

  #nameOf(key: string): string | undefined {
    const name = key.slice(this.#agentsPrefix.length)
    return key.startsWith(this.#agentsPrefix) && isAgentName(name) ? name : undefined
  }

  /** A fresh listing: new and changed records join, members it lacks become suspects (the first listing has none). */
  #applyListing(kvs: EtcdKeyValue[], first: boolean): void {
    const listed = new Set<string>()
    for (const kv of kvs) {
      const name = this.#nameOf(kv.key)
      if (name === undefined || name === this.#self.name) continue
      const record = decodeRecord(kv.key, name, kv.value, kv.modRevision)
      if (record instanceof RdmaError) continue // not a member: never a peer
      listed.add(name)
      this.#upsert(record)
    }
    if (first) return
    for (const record of this.#members.values()) if (!listed.has(record.name)) this.#suspect(record)
  }

  #onEvent(event: EtcdWatchEvent): void {
    const name = this.#nameOf(event.kv.key)
    if (name === undefined) return
    if (name === this.#self.name) {
      if (event.type === 'PUT' && !this.#isMine(event.kv)) this.#displaced(event.kv)
      // Our key deleted (the lease expired while we were cut off): re-register now, not at the next tick.
      else if (event.type === 'DELETE' && this.#state === 'registered') this.#scheduleKeepAlive(0)
      return
    }
    if (event.type === 'DELETE') return this.#remove(name, 'deleted')
    const record = decodeRecord(event.kv.key, name, event.kv.value, event.kv.modRevision)
    if (record instanceof RdmaError) return this.#remove(name, 'deleted') // overwritten with something that is not an agent
    this.#upsert(record)
  }

  #upsert(record: PeerRecord): void {
    clearTimeout(this.#suspects.get(record.name))
    this.#suspects.delete(record.name)
    const old = this.#members.get(record.name)
    this.#members.set(record.name, record)
    if (old && old.incarnation !== record.incarnation) this.#events.left({ record: old, reason: 'replaced' })
    if (!old || old.incarnation !== record.incarnation) this.#events.joined(record)
  }

  #remove(name: string, reason: PeerLeftReason): void {
    clearTimeout(this.#suspects.get(name))
    this.#suspects.delete(name)
    const old = this.#members.get(name)
    if (!old) return
    this.#members.delete(name)
    this.#events.left({ record: old, reason })
  }

  /** Absent from a listing after an outage: etcd may have lost everyone's records; a live agent puts its own back within its TTL. */
  #suspect(record: PeerRecord): void {
    if (this.#suspects.has(record.name)) return
    const timer = setTimeout(() => {
      this.#suspects.delete(record.name)
      if (this.#members.get(record.name) === record) this.#remove(record.name, 'missing')
    }, record.ttlSeconds * 1000 + RETRY_MS)
    timer.unref()
    this.#suspects.set(record.name, timer)
  }
}
