// What an agent publishes about itself under <prefix>agents/<name>, and the
// check that a record read back is one: a malformed value (another program's,
// or a newer format) is never taken for a peer.
import { RdmaError } from '../../core/errors.js'

/** Version of the record's JSON; a record of another version is not a member. */
export const RECORD_FORMAT = 1

/** Most addresses a record may list (an agent has at most 4 rails: rails.ts; room for more later). */
export const MAX_ADDRESSES = 16

/** One place a peer listens on: one per device (rail), in rail order. */
export interface PeerAddress {
  readonly host: string
  readonly port: number
  /** The RDMA device the address belongs to, e.g. 'rxe0' ('tcp' for an agent on the TCP transport). */
  readonly device: string
}

/** An agent of the cluster as its metadata record says. */
export interface PeerRecord {
  readonly name: string
  /** New at every start of the agent (its `id`, a random UUID): a restarted agent is another incarnation. */
  readonly incarnation: string
  /**
   * Where it listens: one address per rail (options.devices), rail 0's first;
   * connect() by name dials them in order. Records of agents before rails
   * were published list one (rail 0's) and are read as they are.
   */
  readonly addresses: readonly PeerAddress[]
  /** The version of its segment table (it grows with every register/unregister; the table itself travels on the link). */
  readonly segmentsVersion: number
  /** Its lease's time to live, in seconds: how long it stays listed after it stops refreshing it. */
  readonly ttlSeconds: number
  /** etcd's revision of this version of the record (later writes have larger ones). */
  readonly revision: number
}

/** Names that can be a key segment: no '/', nothing etcd tools would print badly. */
const NAME = /^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/

/** A record of the cluster (from members() or 'peerJoined'), as connect() takes it. */
export function isPeerRecord(value: unknown): value is PeerRecord {
  return typeof value === 'object' && value !== null && typeof (value as PeerRecord).incarnation === 'string' && Array.isArray((value as PeerRecord).addresses)
}

export function isAgentName(name: unknown): name is string {
  return typeof name === 'string' && NAME.test(name)
}

export const NAME_RULE = 'a name of 1..128 characters from A-Z a-z 0-9 . _ : @ - (not starting with a punctuation mark)'

/** The JSON stored in etcd (the revision is etcd's, not stored). */
export function encodeRecord(record: Omit<PeerRecord, 'revision'>): string {
  return JSON.stringify({ v: RECORD_FORMAT, name: record.name, incarnation: record.incarnation, addresses: record.addresses.map((a) => ({ host: a.host, port: a.port, device: a.device })),
    segmentsVersion: record.segmentsVersion, ttlSeconds: record.ttlSeconds })
}

function bad(key: string, why: string): RdmaError {
  return new RdmaError(`The metadata record under ${key} is not an agent's: ${why}`, { code: 'ERR_METADATA_RECORD' })
}

const isInteger = (value: unknown, min: number, max: number): value is number => typeof value === 'number' && Number.isInteger(value) && value >= min && value <= max

/** The record stored under `key` as `name`, or the reason it is not one. */
export function decodeRecord(key: string, name: string, value: string, revision: number): PeerRecord | RdmaError {
  let json: unknown
  try {
    json = JSON.parse(value)
  } catch {
    return bad(key, 'not JSON')
  }
  if (typeof json !== 'object' || json === null) return bad(key, 'not an object')
  const o = json as Record<string, unknown>
  if (o.v !== RECORD_FORMAT) return bad(key, `format ${JSON.stringify(o.v)}, this agent reads ${RECORD_FORMAT}`)
  if (o.name !== name) return bad(key, `it names ${JSON.stringify(o.name)}`)
  if (typeof o.incarnation !== 'string' || o.incarnation.length < 1 || o.incarnation.length > 48) return bad(key, 'no incarnation')
  if (!Array.isArray(o.addresses) || o.addresses.length < 1) return bad(key, 'no addresses')
  if (o.addresses.length > MAX_ADDRESSES) return bad(key, `${o.addresses.length} addresses (at most ${MAX_ADDRESSES})`)
  const addresses: PeerAddress[] = []
  for (const a of o.addresses as unknown[]) {
    const address = a as Record<string, unknown> | null
    if (typeof address !== 'object' || address === null || typeof address.host !== 'string' || address.host.length === 0 || address.host.length > 253 ||
      !isInteger(address.port, 1, 65535) || typeof address.device !== 'string' || address.device.length === 0 || address.device.length > 64) {
      return bad(key, `a malformed address ${JSON.stringify(a)?.slice(0, 80)}`)
    }
    // One address per rail: a device listed twice, or one listener listed twice, is not a record an agent writes.
    if (addresses.some((b) => b.device === address.device)) return bad(key, `device ${JSON.stringify(address.device)} listed twice`)
    if (addresses.some((b) => b.host === address.host && b.port === address.port)) return bad(key, `address ${address.host}:${address.port} listed twice`)
    addresses.push({ host: address.host, port: address.port, device: address.device })
  }
  if (!isInteger(o.segmentsVersion, 0, Number.MAX_SAFE_INTEGER)) return bad(key, 'no segment table version')
  if (!isInteger(o.ttlSeconds, 1, 1 << 30)) return bad(key, 'no lease TTL')
  return Object.freeze({ name, incarnation: o.incarnation, addresses: Object.freeze(addresses), segmentsVersion: o.segmentsVersion, ttlSeconds: o.ttlSeconds, revision })
}
