// The `metadata` option of TransferAgent.create(): etcd endpoints and the
// registry's settings, checked with the project's argument errors.
import { integer, object, rangeError, typeError } from '../../core/validate.js'
import type { EtcdEndpoint } from './etcd-client.js'

export interface MetadataOptions {
  /** etcd client URLs, e.g. ['http://10.0.0.5:2379'] ('etcd://host:port' and 'host:port' too; port 2379 when left out). */
  endpoints: readonly string[]
  /** The lease's time to live: a dead agent stays listed at most this long (default 10 s, 2..3600). */
  ttlSeconds?: number
  /** Key prefix of the cluster (default '/node-ibverbs/transfer/'): agents with the same prefix see each other. */
  prefix?: string
  /** Bound on each etcd request, so on a lookup of a peer not yet known (default 2000 ms). */
  requestTimeoutMs?: number
}

/** `metadata`: an endpoint list, or the options. */
export type MetadataSetting = readonly string[] | MetadataOptions

export interface MetadataSettings {
  endpoints: EtcdEndpoint[]
  ttlSeconds: number
  prefix: string
  requestTimeoutMs: number
}

export const METADATA_DEFAULTS = { ttlSeconds: 10, prefix: '/node-ibverbs/transfer/', requestTimeoutMs: 2000 }
const ENDPOINT = "an etcd endpoint such as 'http://127.0.0.1:2379'"

function endpoint(value: unknown, name: string): EtcdEndpoint {
  if (typeof value !== 'string' || value.length === 0 || value.length > 300) throw typeError(ENDPOINT, name, value)
  let url: URL
  try {
    url = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(value) ? value : `http://${value}`)
  } catch {
    throw typeError(ENDPOINT, name, value)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'etcd:') throw typeError(`${ENDPOINT} (http only: no TLS)`, name, value)
  if (!url.hostname || (url.pathname !== '/' && url.pathname !== '') || url.search || url.hash || url.username) throw typeError(ENDPOINT, name, value)
  const port = url.port === '' ? 2379 : Number(url.port)
  const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname
  return { host, port }
}

/** The checked settings of `metadata`. */
export function metadataSettings(value: unknown, name = 'options.metadata'): MetadataSettings {
  const o: Record<string, unknown> = Array.isArray(value) ? { endpoints: value } : object(value, name)
  const listName = Array.isArray(value) ? name : `${name}.endpoints`
  if (!Array.isArray(o.endpoints)) throw typeError('a list of etcd endpoints', listName, o.endpoints)
  if (o.endpoints.length === 0 || o.endpoints.length > 16) throw rangeError('1 to 16 etcd endpoints', listName, o.endpoints.length)
  const endpoints = (o.endpoints as unknown[]).map((e, i) => endpoint(e, `${listName}[${i}]`))
  let prefix = METADATA_DEFAULTS.prefix
  if (o.prefix !== undefined) {
    if (typeof o.prefix !== 'string' || !/^\/[\x21-\x7e]{0,255}$/.test(o.prefix)) throw typeError("a key prefix starting with '/' (printable ASCII, no spaces)", `${name}.prefix`, o.prefix)
    prefix = o.prefix.endsWith('/') ? o.prefix : `${o.prefix}/`
  }
  return {
    endpoints,
    prefix,
    ttlSeconds: integer(o.ttlSeconds ?? METADATA_DEFAULTS.ttlSeconds, `${name}.ttlSeconds`, 2, 3600),
    requestTimeoutMs: integer(o.requestTimeoutMs ?? METADATA_DEFAULTS.requestTimeoutMs, `${name}.requestTimeoutMs`, 100, 60_000),
  }
}
