// Who may connect to an agent (options.admission): a shared secret both
// sides prove they hold, by HMAC-SHA256 over a transcript of the handshake
// (a nonce of each side, both agents' ids and names, the transport, the
// protocol and the direction), and a list of peer names the listening side
// admits. The secret never travels; a proof is good for one handshake only
// (the listening side's nonce is fresh each time) and for one direction only
// (a listener's proof sent back as a connector's does not pass). A refused
// peer hears why in a 'refused' message before the connection closes; the
// listening side sends its table, opens its data path (RDMA: connects its data
// QPs; TCP: serves frames) only after the peer proved itself. Both links
// (link.ts, tcp/link.ts) drive the same steps.
import { createHmac, createSecretKey, randomBytes, timingSafeEqual, type KeyObject } from 'node:crypto'
import { RdmaError } from '../core/errors.js'
import { object, rangeError, typeError } from '../core/validate.js'
import type { TransportKind } from './transport.js'

/** What TransferAgent.create() takes as options.admission (docs/access.md, "Who may connect"). */
export interface AdmissionOptions {
  /**
   * A secret every agent of the cluster is given (at least 16 bytes; a string
   * counts its UTF-8 bytes). With it, a peer is admitted only if it proves it
   * holds the same one, and this agent connects only to agents that prove it.
   */
  secret?: string | Uint8Array
  /** Names of the peers this agent admits when they connect to it (the name each gives itself; with a secret, bound by its proof). */
  allow?: readonly string[]
}

/** options.admission, checked: the secret as a key object (never kept as bytes of the caller's), the allowed names. */
export interface Admission { key: KeyObject | undefined; allow: ReadonlySet<string> | undefined }

export const MIN_SECRET_BYTES = 16
/** The first part of every transcript: a proof of this scheme is never one of another's. */
const LABEL = 'node-ibverbs transfer admission 1'
/** Bytes of a nonce and of a proof (HMAC-SHA256). */
const NONCE_BYTES = 32
const BASE64_32 = /^[A-Za-z0-9+/]{43}=$/

/** options.admission checked once (undefined: every peer that speaks the protocol is admitted). */
export function admissionSettings(value: unknown): Admission | undefined {
  if (value === undefined) return undefined
  const o = object(value, 'options.admission')
  if (o.secret === undefined && o.allow === undefined) throw typeError('{ secret } and/or { allow }', 'options.admission', value)
  let key: KeyObject | undefined
  if (o.secret !== undefined) {
    if (typeof o.secret !== 'string' && !(o.secret instanceof Uint8Array)) throw typeError('a string or a Uint8Array', 'options.admission.secret', o.secret)
    const bytes = typeof o.secret === 'string' ? Buffer.from(o.secret) : Buffer.from(o.secret) // a copy: later changes to the caller's array do not count
    if (bytes.length < MIN_SECRET_BYTES) throw rangeError(`a secret of at least ${MIN_SECRET_BYTES} bytes`, 'options.admission.secret', `${bytes.length} bytes`)
    key = createSecretKey(bytes)
    bytes.fill(0)
  }
  let allow: Set<string> | undefined
  if (o.allow !== undefined) {
    if (!Array.isArray(o.allow) || !o.allow.every((name) => typeof name === 'string')) throw typeError('an array of peer names', 'options.admission.allow', o.allow)
    allow = new Set(o.allow as string[])
  }
  return { key, allow }
}

/** Who is on each end of a handshake: the connecting side (client) and the listening side (server). */
export interface Transcript {
  transport: TransportKind
  clientNonce: Buffer
  serverNonce: Buffer
  client: { agent: string; name: string }
  server: { agent: string; name: string }
}

export type ProofRole = 'listener' | 'connector'

/** The proof of `role` for a handshake: HMAC-SHA256 over every part, each length-prefixed (no two transcripts encode alike). */
export function proof(key: KeyObject, role: ProofRole, t: Transcript): Buffer {
  const hmac = createHmac('sha256', key)
  const parts = [LABEL, role, t.transport, t.clientNonce, t.serverNonce, t.client.agent, t.client.name, t.server.agent, t.server.name]
  for (const part of parts) {
    const bytes = typeof part === 'string' ? Buffer.from(part) : part
    const length = Buffer.alloc(4)
    length.writeUInt32BE(bytes.length)
    hmac.update(length).update(bytes)
  }
  return hmac.digest()
}

/** Whether `claimed` (base64, from the wire) is the proof of `role` for this handshake; compared in constant time. */
export function verifyProof(key: KeyObject, role: ProofRole, t: Transcript, claimed: unknown): boolean {
  const got = decode32(claimed)
  return got !== undefined && timingSafeEqual(got, proof(key, role, t))
}

/** 32 bytes in base64 from the wire, or undefined for anything else. */
function decode32(value: unknown): Buffer | undefined {
  return typeof value === 'string' && BASE64_32.test(value) ? Buffer.from(value, 'base64') : undefined
}

export function newNonce(): Buffer { return randomBytes(NONCE_BYTES) }

/** Why a side refuses the other: it did not prove the secret, or its name is not allowed. */
export type RefusedWhy = 'secret' | 'name'
export interface RefusedMessage { t: 'refused'; why: RefusedWhy }
export interface ProofMessage { t: 'proof'; proof: string }

const TOLD: Record<RefusedWhy, string> = {
  secret: 'this agent did not prove the shared secret (options.admission.secret is missing on one side, or the two differ)',
  name: 'its options.admission.allow does not list this agent\'s name',
}

/** What a side that receives a 'refused' throws. */
export function refusedByPeer(why: unknown): RdmaError {
  const reason = TOLD[why as RefusedWhy] ?? `reason ${JSON.stringify(why)?.slice(0, 40)}`
  return new RdmaError(`The peer refused this agent: ${reason}`, { code: 'ERR_PEER_REFUSED' })
}

/** What a side that refuses the other throws (its handshake fails with it; the peer is sent `message`). */
export class Refusal {
  readonly message: RefusedMessage
  readonly error: RdmaError
  constructor(why: RefusedWhy, text: string) {
    this.message = { t: 'refused', why }
    this.error = new RdmaError(text, { code: 'ERR_PEER_REFUSED' })
  }
}

const who = (peer: { agent: string; name: string }) => `'${peer.name}' (${peer.agent})`

/** The connecting side's steps: a nonce in its hello; the listener's proof checked, its own sent back. */
export class ConnectorGate {
  readonly #nonce = newNonce()
  constructor(readonly admission: Admission | undefined, readonly transport: TransportKind, readonly self: { agent: string; name: string }) {}

  /** Fields of the hello: a nonce, when this side holds a secret. */
  hello(): { nonce?: string } {
    return this.admission?.key ? { nonce: this.#nonce.toString('base64') } : {}
  }

  /**
   * Checks the listener's welcome: without a secret here, nothing to check
   * (undefined); with one, the welcome must prove it: the proof to send back,
   * or a Refusal (no proof, or a wrong one).
   */
  answer(welcome: { agent: string; name: string; nonce?: unknown; proof?: unknown }, where: string): ProofMessage | Refusal | undefined {
    const key = this.admission?.key
    if (!key) return undefined
    const server = { agent: welcome.agent, name: String(welcome.name) }
    const serverNonce = decode32(welcome.nonce)
    if (serverNonce === undefined || welcome.proof === undefined) {
      return new Refusal('secret', `The agent at ${where} does not prove the shared secret (it has no options.admission.secret): refused, this agent sent it no table`)
    }
    const t: Transcript = { transport: this.transport, clientNonce: this.#nonce, serverNonce, client: this.self, server }
    if (!verifyProof(key, 'listener', t, welcome.proof)) {
      return new Refusal('secret', `The agent at ${where} failed to prove the shared secret (its options.admission.secret differs): refused, this agent sent it no table`)
    }
    return { t: 'proof', proof: proof(key, 'connector', t).toString('base64') }
  }
}

/** The listening side's steps: the hello checked, its proof in the welcome, the peer's proof checked before anything of the table goes. */
export class ListenerGate {
  readonly #nonce = newNonce()
  readonly #peer: { agent: string; name: string }
  readonly #peerNonce: Buffer | undefined
  readonly #peerName: unknown

  constructor(readonly admission: Admission | undefined, readonly transport: TransportKind, readonly self: { agent: string; name: string },
    hello: { agent: string; name: unknown; nonce?: unknown }) {
    this.#peerName = hello.name
    this.#peer = { agent: hello.agent, name: String(hello.name) }
    this.#peerNonce = decode32(hello.nonce)
  }

  /** True when the peer must prove the secret (a 'proof' message follows the welcome). */
  get proving(): boolean { return this.admission?.key !== undefined }

  /** At the hello: a Refusal, or undefined to go on (with a secret, the name waits for the proof that binds it). */
  atHello(): Refusal | undefined {
    if (!this.admission) return undefined
    if (this.admission.key && this.#peerNonce === undefined) {
      return new Refusal('secret', `Peer ${who(this.#peer)} offered no proof of the shared secret (it has no options.admission.secret): refused, it was sent no table`)
    }
    return this.admission.key ? undefined : this.#checkName()
  }

  /** Fields of the welcome: this side's nonce and proof, when it holds a secret (and the peer sent a nonce). */
  welcome(): { nonce?: string; proof?: string } {
    const key = this.admission?.key
    if (!key || !this.#peerNonce) return {}
    return { nonce: this.#nonce.toString('base64'), proof: proof(key, 'listener', this.#transcript(this.#peerNonce)).toString('base64') }
  }

  /** The peer's 'proof': a Refusal (a wrong proof, or a name not allowed), or undefined: admitted. */
  checkProof(message: { proof?: unknown }): Refusal | undefined {
    const key = this.admission!.key!
    if (!verifyProof(key, 'connector', this.#transcript(this.#peerNonce!), message.proof)) {
      return new Refusal('secret', `Peer ${who(this.#peer)} failed to prove the shared secret (its options.admission.secret differs): refused, it was sent no table`)
    }
    return this.#checkName()
  }

  #checkName(): Refusal | undefined {
    const allow = this.admission?.allow
    if (!allow || (typeof this.#peerName === 'string' && allow.has(this.#peerName))) return undefined
    return new Refusal('name', `Peer ${who(this.#peer)} is not in options.admission.allow: refused, it was sent no table`)
  }

  #transcript(clientNonce: Buffer): Transcript {
    return { transport: this.transport, clientNonce, serverNonce: this.#nonce, client: this.#peer, server: this.self }
  }
}
