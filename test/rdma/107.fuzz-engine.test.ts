// Property-based fuzzer of the transfer engine and the lock table (issue 27).
// Per run: three TransferAgents in this process on the test device, and a
// connected RC pair under two RemoteLockTables; random calls in random
// orders (register with or without per-peer grants, grant, revoke, unregister,
// connect, write, read, prepare + run, notify, resume, closePeer, close;
// acquire, release, renew, fence), segments
// withdrawn and agents closed while transfers are live, hostile arguments.
// Properties: every call returns or fails with a coded Error, with the code
// the table (fuzz-codes.ts) expects for its hostile argument; every promise
// settles within a bound once its objects are closed; the bytes of every
// transfer that resolved are right at the peer; no RDMA handle survives.
//
// Replay: FUZZ_SEED=<seed> with this file. FUZZ_RUNS / FUZZ_ACTIONS change the
// size; FUZZ_TRACE=1 prints each call before it is made.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { writeSync } from 'node:fs'
import {
  Peer, RemoteLockTable, RemoteSlice, Segment, TransferAgent, TransferError, TransferPlan, remoteRegion,
  type Device, type LockGrant,
} from '../../dist/index.js'
import { connectedPair, pattern, testDevice } from './helpers.js'
import { countResources, keepLibrdmacmPd } from './resources.js'
import { ACCEPTED, CLOSED, CodeChecks, TYPE, int, nullishInt, obj, optFn, optInst, optInt, optObj, optOneOf, show } from './fuzz-codes.js'

const RUNS = Number(process.env.FUZZ_RUNS ?? 10)
const ACTIONS = Number(process.env.FUZZ_ACTIONS ?? 600)
const SEED = process.env.FUZZ_SEED === undefined ? (Date.now() ^ (Math.random() * 0x7fffffff)) | 0 : Number(process.env.FUZZ_SEED)
const TRACE = process.env.FUZZ_TRACE === '1'
const HOST = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
/** How long promises may take to settle once everything they name is closed (stall and handshake bounds are 3 s here). */
const SETTLE_BOUND_MS = 30_000
const AGENTS = 3
/** Segments are SLOTS slots of SLOT bytes: a transfer holds its slot on both sides, so the bytes it moves are its own. */
const SLOT = 4096
const SLOTS = 8
const SEGMENT = SLOT * SLOTS
const RIGHTS = ['none', 'read', 'write', 'read-write'] as const
const OK = 'accepted (no error)'
const BLOCK_RANGE = 'ERR_BLOCK_RANGE'
/** noticePayload(): a string or Uint8Array of at most 1024 bytes (MAX_NOTIFICATION_BYTES), else ERR_MESSAGE_TOO_LARGE. */
const notice = (v: unknown): string | undefined => typeof v === 'string' ? (Buffer.byteLength(v) > 1024 ? 'ERR_MESSAGE_TOO_LARGE' : undefined)
  : v instanceof Uint8Array ? (v.byteLength > 1024 ? 'ERR_MESSAGE_TOO_LARGE' : undefined) : TYPE

const HOSTILE: readonly unknown[] = [undefined, null, NaN, Infinity, -1, -0, 0, 0.5, 1, 7, 2 ** 31, 2 ** 32, 2 ** 53, '', 'x', '8', '::1',
  'read', true, false, [], {}, [[]], { version: 1 }, { host: 1 }, () => 1, Symbol('fuzz'), 0n, -1n, 2n ** 64n, new Uint8Array(0),
  new Uint8Array(5000), new Date(0), Object.create(null), new Proxy({}, {})]

function hostile(w: number): unknown {
  switch (w & 3) {
    case 0: return (w >> 2) - 2 ** 28
    case 1: return (w | 0) / 65536
    default: return HOSTILE[(w >>> 2) % HOSTILE.length]
  }
}

interface Action { op: number; i: number; j: number; k: number; n: number; o: number; bad: number; h: unknown }
const WORDS = 7
function action(words: Uint32Array, at: number): Action {
  const w = (x: number) => words[at + x]!
  return { op: w(0), i: w(1), j: w(2), k: w(3), n: w(4), o: w(5) & 0xffff, bad: (w(5) >>> 16) % 10, h: hostile(w(6)) }
}

function pick<T>(list: readonly T[], n: number): T | undefined {
  return list.length === 0 ? undefined : list[n % list.length]
}

// --- outcomes and checks --------------------------------------------------

const outcomes = new Map<string, number>()
const byCall = new Map<string, Map<string, number>>()
const count = (call: string, outcome: string) => {
  outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1)
  const m = byCall.get(call) ?? new Map<string, number>()
  byCall.set(call, m.set(outcome, (m.get(outcome) ?? 0) + 1))
}
const codes = new CodeChecks()
/** A bad length is checked after the segments are resolved, once the link is there: a segment withdrawn meanwhile (here, or at the peer) is reported first. */
const MOVED_OR_RANGE = `${BLOCK_RANGE}|ERR_SEGMENT_WITHDRAWN|ERR_SEGMENT_UNKNOWN`
interface Check { argument: string; value: unknown; expected: string | undefined }
const checking = (argument: string, value: unknown, expected: string | undefined): Check => ({ argument, value, expected })

function codeOf(error: unknown): string | undefined {
  return error instanceof Error && typeof (error as { code?: unknown }).code === 'string' ? (error as unknown as { code: string }).code : undefined
}

class World {
  run = 0
  agents: TransferAgent[] = []
  names: string[] = []
  /** Peers as [the agent that holds the handle, the handle, the index of the agent it names]. */
  peers: Array<{ at: number; peer: Peer; to: number }> = []
  segments: Array<{ at: number; segment: Segment }> = []
  /** Slots held by a transfer in flight: `${agent}/${segment}/${slot}`. */
  busy = new Set<string>()
  plans: Array<{ at: number; plan: TransferPlan; to: number; op: 'write' | 'read'; local: Segment; remote: string; slot: number }> = []
  failedTransfers: Array<{ at: number; error: TransferError }> = []
  promises = new Map<Promise<unknown>, string>()
  failures: Error[] = []
  calls = 0
  verified = 0
  verifiedBytes = 0
  segmentCounter = 0
  // the lock tables
  closeLocks: (() => void) | undefined
  /** Agents closed (TransferAgent has no `closed`: close() is idempotent). */
  closedAgents = new Set<number>()
  locksOpen = false
  tables: RemoteLockTable[] = []
  grants: Array<{ table: RemoteLockTable; grant: LockGrant }> = []
  lockSlices: { locks: RemoteSlice; tokens: RemoteSlice; fence: RemoteSlice } | undefined
  qp: unknown
}

function invoke(w: World, name: string, fn: () => unknown, check?: Check): unknown {
  w.calls++
  if (TRACE) writeSync(2, `fuzz-engine trace: run ${w.run} call ${w.calls} ${name}${check ? ` ${check.argument}=${show(check.value)}` : ''}\n`)
  const settled = (outcome: unknown) => { if (check) codes.compare(name, check.argument, check.value, check.expected, outcome) }
  const failed = (error: unknown) => {
    const code = codeOf(error)
    if (code === undefined) {
      const shown = error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error)
      w.failures.push(new Error(`${name}${check ? ` (${check.argument} = ${show(check.value)})` : ''}: failed without a coded Error: ${shown}`, { cause: error }))
      count(name, 'UNCODED')
    } else {
      count(name, code)
    }
    settled(error)
  }
  let result: unknown
  try {
    result = fn()
  } catch (error) {
    failed(error)
    return undefined
  }
  if (result instanceof Promise) {
    const tracked: Promise<void> = result.then(() => { count(name, 'resolved'); settled(ACCEPTED) }, failed).finally(() => w.promises.delete(tracked))
    w.promises.set(tracked, name)
  } else {
    count(name, 'returned')
    settled(ACCEPTED)
  }
  return result
}

// --- transfers whose bytes are checked ------------------------------------

/** A free slot of both segments (held until the transfer settles), or undefined. */
function takeSlot(w: World, a: number, local: Segment, b: number, remote: string, n: number): number | undefined {
  for (let x = 0; x < SLOTS; x++) {
    const slot = (n + x) % SLOTS
    const keys = [`${a}/${local.name}/${slot}`, `${b}/${remote}/${slot}`]
    if (keys.every((k) => !w.busy.has(k))) {
      keys.forEach((k) => w.busy.add(k))
      return slot
    }
  }
  return undefined
}

function freeSlot(w: World, a: number, local: Segment, b: number, remote: string, slot: number): void {
  w.busy.delete(`${a}/${local.name}/${slot}`)
  w.busy.delete(`${b}/${remote}/${slot}`)
}

/** After a transfer resolved: the destination's slot holds the source's bytes (both were held by it alone). */
function verify(w: World, op: 'write' | 'read', a: number, local: Segment, b: number, remote: string, slot: number, length: number, seed: number): void {
  const peerSegment = w.agents[b]!.segments.get(remote)
  const data = pattern(length, seed)
  const landed = op === 'write' ? peerSegment?.bytes.subarray(slot * SLOT, slot * SLOT + length) : local.bytes.subarray(slot * SLOT, slot * SLOT + length)
  // A segment withdrawn (or re-registered) since is not the memory the transfer wrote: nothing to compare.
  if (!landed || (op === 'write' && peerSegment!.withdrawn)) return
  if (Buffer.compare(landed, data) !== 0) {
    w.failures.push(new Error(`${op} ${w.names[a]} -> ${w.names[b]} '${remote}' slot ${slot} (${length} bytes) resolved, but the bytes at the destination differ`))
  } else {
    w.verified++
    w.verifiedBytes += length
  }
}

/** Whether `peer`'s table (as this side has it now) names the registration agent `b` has under `remote` now (same rkey). */
function viewIsCurrent(w: World, peer: Peer, b: number, remote: string): boolean {
  const view = (peer as unknown as { link?: { remote: { byName: Map<string, { region: { rkey: number } }> } } }).link?.remote.byName.get(remote)
  const region = w.agents[b]!.segments.get(remote)?.region as { rkey?: number } | undefined
  return view !== undefined && region?.rkey !== undefined && view.region.rkey === region.rkey
}

/** The source's bytes for a transfer: written before it is made, checked at the destination once it resolved. */
function fillSource(w: World, op: 'write' | 'read', local: Segment, b: number, remote: string, slot: number, length: number, seed: number): boolean {
  const source = op === 'write' ? local : w.agents[b]!.segments.get(remote)
  if (!source || source.withdrawn) return false
  source.bytes.set(pattern(length, seed), slot * SLOT)
  return true
}

/** A transfer of one slot between an agent's segment and its peer's, with the options hostile or not. */
function transfer(w: World, a0: Action, op: 'write' | 'read', planned: boolean): void {
  // Three in four transfers have no hostile argument: their bytes are checked at the destination.
  const a = a0.o & 0xc ? { ...a0, bad: 9 } : a0
  const p = pick(w.peers, a.i)
  if (!p) return
  const agent = w.agents[p.at]!
  const locals = w.segments.filter((s) => s.at === p.at && !s.segment.withdrawn)
  const local = pick(locals, a.j)?.segment
  const remotes = [...p.peer.segments.values()].filter((s) => s.length >= SEGMENT && (op === 'write' ? s.rights.includes('write') : s.rights !== 'none' && s.rights !== 'write'))
  const remote = pick(remotes, a.k)?.name ?? 'nope'
  const length = 1 + a.n % SLOT
  const seed = a.n
  const slot = local ? takeSlot(w, p.at, local, p.to, remote, a.n) : undefined
  let blocks: unknown = local && slot !== undefined ? [{ local: [local, slot * SLOT], remote: [remote, slot * SLOT], length }] : [{ local: ['nope', 0], remote: [remote, 0], length }]
  const o: Record<string, unknown> = { timeoutMs: 5000 + a.n % 3000 }
  if (a.o & 1) o.notify = `n${a.n}`
  if (a.o & 2) o.stallTimeoutMs = 1000 + a.n % 2000
  let options: unknown = o
  let peer: unknown = p.peer
  let check: Check | undefined
  // #linkOf(): a closed agent refuses (ERR_CLOSED) before the peer is looked at; a peer closed with closePeer()
  // is no longer one of the agent's, which refuses it as ERR_INVALID_ARG_TYPE ("a Peer of this agent").
  const agentClosed = w.closedAgents.has(p.at)
  const peerCode = agentClosed ? CLOSED : p.peer.state === 'closed' ? TYPE : undefined
  // Order: the options (object, timeoutMs, signal, stallTimeoutMs, onProgress, notify), then the agent and peer (#linkOf), then the blocks.
  switch (a.bad) {
    case 0: options = a.h; check = checking('options', a.h, optObj(a.h)); break
    case 1: o.timeoutMs = a.h; check = checking('options.timeoutMs', a.h, optInt(0, 2 ** 31 - 1)(a.h)); break
    case 2: o.stallTimeoutMs = a.h; check = checking('options.stallTimeoutMs', a.h, nullishInt(1, 2 ** 31)(a.h)) /* `?? stallMs` */; break
    case 3: o.notify = a.h; check = checking('options.notify', a.h, a.h === undefined ? undefined : notice(a.h)); break
    case 4: peer = a.h; check = checking('peer', a.h, agentClosed ? CLOSED : TYPE); break
    case 5:
      blocks = a.h
      check = checking('blocks', a.h, peerCode ?? (p.peer.state === 'connected' ? TYPE : undefined))
      break
    case 6:
      if (local && slot !== undefined) {
        blocks = [{ local: [local, slot * SLOT], remote: [remote, slot * SLOT], length: a.h }]
        const valid = typeof a.h === 'number' && Number.isInteger(a.h) && a.h >= 1 && a.h <= SEGMENT - slot * SLOT
        check = checking('blocks[0].length', a.h, peerCode ?? (p.peer.state === 'connected' && remote !== 'nope' && !valid ? MOVED_OR_RANGE : undefined))
      }
      break
    case 7: o.onProgress = a.h; check = checking('options.onProgress', a.h, optFn(a.h)); break
    case 8: o.signal = a.h; check = checking('options.signal', a.h, optInst(AbortSignal)(a.h)); break
  }
  if (check?.expected === undefined && peerCode !== undefined) check = checking(check?.argument ?? '(the agent or peer)', check?.value ?? 'closed', peerCode)
  if (a.bad === 1 && check?.expected === undefined) o.timeoutMs = 5000 // a valid hostile bound would wait (bounded) far too long
  if (a.bad === 2 && check?.expected === undefined) o.stallTimeoutMs = 2000
  // A hostile onProgress that is a function is called: a plain one.
  if (typeof o.onProgress === 'function') o.onProgress = () => {}
  const release = () => { if (local && slot !== undefined) freeSlot(w, p.at, local, p.to, remote, slot) }
  const sourced = local !== undefined && slot !== undefined && fillSource(w, op, local, p.to, remote, slot, length, seed)
  // The caller's view of the peer's table can lag a withdrawal and a new registration under the same
  // name: the transfer then moves the bytes of the registration it knew (allowed), not of the one filled.
  const current = viewIsCurrent(w, p.peer, p.to, remote)
  const name = planned ? `TransferPlan.run (${op})` : `TransferAgent.${op}`
  let result: unknown
  if (planned) {
    // prepare(peer, op, blocks): op first, then the peer's link (ERR_PEER_GONE when not connected), then the blocks.
    const plan = invoke(w, 'TransferAgent.prepare', () => agent.prepare(peer as Peer, op, blocks as never),
      a.bad === 5 ? checking('blocks', a.h, !agentClosed && p.peer.state === 'connected' ? TYPE : undefined) : undefined)
    if (!(plan instanceof TransferPlan)) { release(); return }
    w.plans.push({ at: p.at, plan, to: p.to, op, local: local!, remote, slot: slot ?? 0 })
    result = invoke(w, name, () => plan.run(options as never), a.bad <= 3 || a.bad >= 7 ? check : undefined)
  } else {
    result = invoke(w, name, () => agent[op](peer as Peer, blocks as never, options as never), check)
  }
  if (!(result instanceof Promise)) { release(); return }
  // A failed transfer can be resumed later (its blocks sent again into its slots): those stay held for the run.
  let resumable = false
  result.then(() => {
    if (sourced && current && a.bad !== 5 && a.bad !== 6 && a.bad !== 4) verify(w, op, p.at, local!, p.to, remote, slot!, length, seed)
  }, (error: unknown) => {
    if (error instanceof TransferError) { w.failedTransfers.push({ at: p.at, error }); resumable = true }
  }).finally(() => { if (!resumable) release() })
}

// --- per-peer grants ----------------------------------------------------------

/** grant-options.ts checkPeers(): undefined or 'any', else a list of names of 1..128 characters. */
const isPeerName = (v: unknown) => typeof v === 'string' && v.length >= 1 && v.length <= 128
const peersRule = (v: unknown): string | undefined =>
  v === undefined || v === 'any' ? undefined : !Array.isArray(v) || !v.every(isPeerName) ? TYPE : undefined

/**
 * The code grant()/revoke() must refuse `segment` with on agent `at`, or undefined when it resolves to a
 * per-peer segment: #assertOpen(), then the table's resolve() (a withdrawn Segment, an unknown name),
 * then a segment every peer shares (ERR_SEGMENT_SHARED).
 */
function segmentCode(w: World, at: number, segment: unknown): string | undefined {
  if (w.closedAgents.has(at)) return CLOSED
  const agent = w.agents[at]!
  let resolved: Segment | undefined
  if (segment instanceof Segment) {
    if (segment.withdrawn || agent.segments.get(segment.name) !== segment) return 'ERR_SEGMENT_WITHDRAWN'
    resolved = segment
  } else {
    resolved = typeof segment === 'string' ? agent.segments.get(segment) : undefined
    if (!resolved) return 'ERR_SEGMENT_UNKNOWN'
  }
  return resolved.peers === 'shared' ? 'ERR_SEGMENT_SHARED' : undefined
}

/**
 * grant(peerName, segment) / revoke(peer, segment) on a segment of the agent's, per-peer or shared, live or
 * withdrawn, by object or name, with a good or hostile peer: while transfers to it run (a revoked peer's
 * batch in flight fails coded, the others go on; the bytes of those that resolve are checked).
 */
function grantOrRevoke(w: World, a: Action, call: 'grant' | 'revoke'): void {
  // Three picks in four name a live per-peer segment of an open agent (the calls that can succeed);
  // the fourth any segment ever registered: withdrawn, shared, or on a closed agent.
  const live = w.segments.filter((x) => !x.segment.withdrawn && x.segment.peers !== 'shared' && !w.closedAgents.has(x.at))
  const s = (a.o >>> 1) % 4 !== 0 && live.length > 0 ? pick(live, a.i) : pick(w.segments, a.i)
  const at = s?.at ?? a.i % AGENTS
  const agent = w.agents[at]!
  let segment: unknown = a.o & 1 ? s?.segment.name : s?.segment
  if (segment === undefined) segment = `s${a.n % 64}`
  // A peer: a connected one's handle (revoke only) or name, any agent's name, or a hostile value.
  const linked = pick(w.peers.filter((p) => p.at === at), a.j)
  let peer: unknown = call === 'revoke' && linked && a.k & 1 ? linked.peer : w.names[a.j % AGENTS]
  let argument = 'segment'
  switch (a.bad) {
    case 0: segment = a.h; break
    case 1: peer = a.h; argument = 'peer'; break
    case 2: segment = `nope${a.n}`; break
  }
  const peerOk = call === 'grant' ? isPeerName(peer) : isPeerName(peer) || peer instanceof Peer
  const expected = segmentCode(w, at, segment) ?? (peerOk ? OK : TYPE)
  const value = argument === 'peer' ? peer : segment
  if (call === 'grant') invoke(w, 'TransferAgent.grant', () => agent.grant(peer as string, segment as never), checking(argument, value, expected))
  else invoke(w, 'TransferAgent.revoke', () => agent.revoke(peer as string, segment as never), checking(argument, value, expected))
}

// --- the calls --------------------------------------------------------------

type Op = (w: World, a: Action) => void

const OPS: Record<string, Op> = {
  register: (w, a) => {
    const at = a.i % AGENTS
    const agent = w.agents[at]!
    let name: unknown = `s${w.segmentCounter++}`
    const o: Record<string, unknown> = { size: SEGMENT, remote: RIGHTS[a.k % 4] }
    // One in two registrations is granted per peer: 'any', or some agents' names (bits of n).
    if (a.o & 0x10) o.peers = a.n % 5 === 0 ? 'any' : w.names.filter((_, x) => (a.n >> x) & 1)
    let options: unknown = o
    let check: Check | undefined
    // #assertOpen() first; then the name, the options object, the rights, the peers, a name taken, the size.
    switch (a.bad) {
      case 5: o.peers = a.h; check = checking('options.peers', a.h, peersRule(a.h)); break
      case 0: name = a.h; check = checking('name', a.h, typeof a.h === 'string' && a.h.length >= 1 && a.h.length <= 128 ? (agent.segments.has(a.h) ? 'ERR_SEGMENT_EXISTS' : undefined) : TYPE); break
      case 1: options = a.h; check = checking('options', a.h, obj(a.h)); break
      case 2: o.remote = a.h; check = checking('options.remote', a.h, optOneOf(RIGHTS)(a.h)); break
      case 3: o.size = a.h; check = checking('options.size', a.h, int(1, Number.MAX_SAFE_INTEGER)(a.h)); break
      case 4: { const taken = pick([...agent.segments.keys()], a.j); if (taken) { name = taken; check = checking('name', taken, 'ERR_SEGMENT_EXISTS') } break }
    }
    if (check?.expected === undefined && a.bad === 3) return // a valid hostile size: an allocation of up to 2^53 bytes
    if (check && w.closedAgents.has(at)) check = checking(check.argument, check.value, CLOSED)
    else if (w.closedAgents.has(at)) check = checking('(the agent)', 'closed', CLOSED)
    const segment = invoke(w, 'TransferAgent.register', () => agent.register(name as string, options as never), check)
    if (segment instanceof Segment) w.segments.push({ at, segment })
  },
  unregister: (w, a) => {
    const s = pick(w.segments, a.i)
    const at = s?.at ?? a.i % AGENTS
    const agent = w.agents[at]!
    let target: unknown = a.o & 1 ? s?.segment.name : s?.segment
    let options: unknown = { timeoutMs: 5000 }
    let check: Check | undefined
    // waitOptions() first (there is no closed check: a closed agent's segments are withdrawn), then the segment.
    switch (a.bad) {
      case 0: options = a.h; check = checking('options', a.h, optObj(a.h)); break
      case 1: options = { timeoutMs: a.h }; check = checking('options.timeoutMs', a.h, optInt(0, 2 ** 31 - 1)(a.h)); break
      case 2:
        target = a.h; check = checking('segment', a.h, 'ERR_SEGMENT_UNKNOWN'); break
      default:
        if (s && s.segment.withdrawn && target instanceof Segment) check = checking('segment', 'withdrawn', 'ERR_SEGMENT_WITHDRAWN')
        if (s && s.segment.withdrawn && typeof target === 'string' && !agent.segments.has(target)) check = checking('segment', 'a withdrawn name', 'ERR_SEGMENT_UNKNOWN')
    }
    if (a.bad === 1 && check?.expected === undefined) options = { timeoutMs: 5000 }
    if (target === undefined && a.bad !== 2) return
    invoke(w, 'TransferAgent.unregister', () => agent.unregister(target as never, options as never), check)
  },
  connect: (w, a) => {
    const at = a.i % AGENTS
    const to = (at + 1 + a.j % (AGENTS - 1)) % AGENTS
    const agent = w.agents[at]!
    const o: Record<string, unknown> = { host: HOST, port: w.closedAgents.has(to) ? 1 : w.agents[to]!.port, timeoutMs: 3000 }
    let target: unknown = o
    let check: Check | undefined
    switch (a.bad) {
      case 0: if (typeof a.h !== 'string') { target = a.h; check = checking('options', a.h, obj(a.h)) } break
      case 1: o.host = a.h; check = checking('options.host', a.h, typeof a.h === 'string' ? undefined : TYPE); break
      case 2: o.port = a.h; check = checking('options.port', a.h, int(1, 65535)(a.h)); break
      case 3: o.timeoutMs = a.h; check = checking('options.timeoutMs', a.h, nullishInt(0, 2 ** 31 - 1)(a.h)); break // `?? handshake bound`
      case 4: o.signal = a.h; check = checking('options.signal', a.h, optInst(AbortSignal)(a.h)); break
    }
    if (check?.expected === undefined && a.bad >= 1 && a.bad <= 3) return // a valid hostile host or port names nobody; a timeout waits
    if (w.closedAgents.has(at)) check = checking(check?.argument ?? '(the agent)', check?.value ?? 'closed', CLOSED) // #assertOpen() first
    const connecting = invoke(w, 'TransferAgent.connect', () => agent.connect(target as never), check)
    if (connecting instanceof Promise) connecting.then((peer: Peer) => { if (!w.peers.some((p) => p.peer === peer)) w.peers.push({ at, peer, to }) }, () => {})
  },
  grant: (w, a) => grantOrRevoke(w, a, 'grant'),
  revoke: (w, a) => grantOrRevoke(w, a, 'revoke'),
  write: (w, a) => transfer(w, a, 'write', false),
  read: (w, a) => transfer(w, a, 'read', false),
  planned: (w, a) => transfer(w, a, a.k & 1 ? 'read' : 'write', true),
  prepareHostile: (w, a) => {
    const p = pick(w.peers, a.i)
    if (!p) return
    const agent = w.agents[p.at]!
    // oneOf(op) first; then the peer's link.
    if (a.bad % 2 === 0) invoke(w, 'TransferAgent.prepare', () => agent.prepare(p.peer, a.h as never, [] as never), checking('op', a.h, optOneOf(['read', 'write'])(a.h) ?? (a.h === undefined ? TYPE : undefined)))
    else invoke(w, 'TransferAgent.prepare', () => agent.prepare(a.h as never, 'write', [] as never), checking('peer', a.h, TYPE))
  },
  rerun: (w, a) => {
    // A plan run again, maybe after its segments were withdrawn or its agent closed: it re-checks, or fails coded.
    const entry = pick(w.plans, a.i)
    if (!entry) return
    // It moves bytes in its slots again: only while no other transfer holds them, and it holds them meanwhile.
    const keys = [`${entry.at}/${entry.local.name}/${entry.slot}`, `${entry.to}/${entry.remote}/${entry.slot}`]
    if (keys.some((k) => w.busy.has(k))) return
    keys.forEach((k) => w.busy.add(k))
    const free = () => keys.forEach((k) => w.busy.delete(k))
    const run = invoke(w, 'TransferPlan.run (again)', () => entry.plan.run({ timeoutMs: 5000 }))
    if (run instanceof Promise) run.then(free, free)
    else free()
  },
  notify: (w, a) => {
    const p = pick(w.peers, a.i)
    if (!p) return
    const agent = w.agents[p.at]!
    let message: unknown = `m${a.n}`
    let options: unknown = { timeoutMs: 3000 }
    let peer: unknown = p.peer
    let check: Check | undefined
    // The options, then the message, then the agent and peer.
    switch (a.bad) {
      case 0: options = a.h; check = checking('options', a.h, optObj(a.h)); break
      case 1: message = a.h; check = checking('message', a.h, notice(a.h)); break
      case 2: peer = a.h; check = checking('peer', a.h, w.closedAgents.has(p.at) ? CLOSED : TYPE); break
      case 3: options = { timeoutMs: a.h }; check = checking('options.timeoutMs', a.h, optInt(0, 2 ** 31 - 1)(a.h)); break
    }
    if (a.bad === 3 && check?.expected === undefined) options = { timeoutMs: 3000 }
    invoke(w, 'TransferAgent.notify', () => agent.notify(peer as Peer, message as never, options as never), check)
  },
  resume: (w, a) => {
    const f = pick(w.failedTransfers, a.i)
    const at = f?.at ?? a.i % AGENTS
    const agent = w.agents[at]!
    // failed first: not a TransferError (ERR_INVALID_ARG_TYPE), one of another agent (ERR_INVALID_ARG_VALUE); then the options.
    if (a.bad === 0 || !f) return void invoke(w, 'TransferAgent.resume', () => agent.resume(a.h as never), checking('failed', a.h, TYPE))
    const other = w.agents[(at + 1) % AGENTS]!
    if (a.bad === 1) return void invoke(w, 'TransferAgent.resume', () => other.resume(f.error), checking('failed', 'of another agent', 'ERR_INVALID_ARG_VALUE'))
    const options: unknown = a.bad === 2 ? a.h : a.bad === 3 ? { onRestart: a.h, timeoutMs: 5000 } : { timeoutMs: 5000 }
    const check = a.bad === 2 ? checking('options', a.h, optObj(a.h)) : a.bad === 3 ? checking('options.onRestart', a.h, optOneOf(['resend', 'keep', 'fail'])(a.h)) : undefined
    invoke(w, 'TransferAgent.resume', () => agent.resume(f.error, options as never), check)
  },
  closePeer: (w, a) => {
    const p = pick(w.peers, a.i)
    if (!p) return
    if (a.bad === 0) return void invoke(w, 'TransferAgent.closePeer', () => w.agents[p.at]!.closePeer(a.h as never), checking('peer', a.h, TYPE))
    if (a.k % 4 === 0) invoke(w, 'TransferAgent.closePeer', () => w.agents[p.at]!.closePeer(p.peer))
  },
  stats: (w, a) => void invoke(w, 'TransferAgent.stats', () => w.agents[a.i % AGENTS]!.stats(), checking('(the agent)', 'any', OK)),
  closeAgent: (w, a) => {
    // Rarely: an agent closed with whatever it has in flight (its transfers must settle, coded).
    if (a.k % 6 !== 0) return
    w.closedAgents.add(a.i % AGENTS)
    invoke(w, 'TransferAgent.close', () => w.agents[a.i % AGENTS]!.close(), checking('(the agent)', 'any', OK))
  },
  // --- the lock table ---
  lockTable: (w, a) => {
    if (!w.lockSlices || w.tables.length >= 4) return
    const { locks, tokens } = w.lockSlices
    const o: Record<string, unknown> = { locks, tokens, owner: 1 + w.tables.length, leaseMs: 50 + a.n % 200, maxBackoffMs: 1 + a.k % 4 }
    let qp: unknown = w.qp
    let check: Check | undefined
    // The qp, the options object, locks, tokens (lengths), then owner, leaseMs, graceMs, maxBackoffMs.
    switch (a.bad) {
      case 0: qp = a.h; check = checking('qp', a.h, TYPE); break
      case 1: o.locks = a.h; check = checking('options.locks', a.h, TYPE); break
      case 2: o.owner = a.h; check = checking('options.owner', a.h, int(1, 0xffff)(a.h)); break
      case 3: o.leaseMs = a.h; check = checking('options.leaseMs', a.h, optInt(1, 2 ** 31 - 1)(a.h)); break
      case 4: o.graceMs = a.h; check = checking('options.graceMs', a.h, optInt(0, 2 ** 31 - 1)(a.h)); break
      case 5: o.maxBackoffMs = a.h; check = checking('options.maxBackoffMs', a.h, optInt(1, 60_000)(a.h)); break
      case 6: {
        const tokensSlice = locks.region.slice(64, 8 + 8 * (a.n % 2))
        o.tokens = tokensSlice
        check = checking('options.tokens.length', tokensSlice.length, locks.length === tokensSlice.length ? undefined : TYPE)
        break
      }
    }
    if (check?.expected === undefined && a.bad >= 3 && a.bad <= 5) { o.leaseMs = 100; delete o.graceMs; o.maxBackoffMs = 2 }
    const table = invoke(w, 'RemoteLockTable', () => new RemoteLockTable(qp as never, o as never), check)
    if (table instanceof RemoteLockTable) w.tables.push(table)
  },
  acquire: (w, a) => {
    const table = pick(w.tables, a.i)
    if (!table) return
    let lock: unknown = a.j % table.size
    let options: unknown = { timeoutMs: 300 + a.n % 500 }
    let check: Check | undefined
    // lockWord(lock) first, then the options (an object: null is refused), then the QP.
    switch (a.bad) {
      case 0: lock = a.h; check = checking('lock', a.h, int(0, table.size - 1)(a.h)); break
      case 1: options = a.h; check = checking('options', a.h, a.h === undefined ? undefined : obj(a.h)); break
      case 2: options = { timeoutMs: a.h }; check = checking('options.timeoutMs', a.h, optInt(0, 2 ** 31 - 1)(a.h)); break
      case 3: options = { signal: a.h }; check = checking('options.signal', a.h, optInst(AbortSignal)(a.h)); break
    }
    if (check?.expected === undefined && a.bad >= 1 && a.bad <= 3) options = { timeoutMs: 500 }
    const acquiring = invoke(w, 'RemoteLockTable.acquire', () => table.acquire(lock as number, options as never), check)
    if (acquiring instanceof Promise) acquiring.then((grant: LockGrant) => { w.grants.push({ table, grant }) }, () => {})
  },
  release: (w, a) => {
    const g = pick(w.grants, a.i)
    if (!g) return
    if (a.bad === 0) {
      return void invoke(w, 'RemoteLockTable.release', () => g.table.release(a.h as never), checking('grant', a.h, TYPE))
    }
    w.grants.splice(w.grants.indexOf(g), 1)
    invoke(w, 'RemoteLockTable.release', () => g.table.release(g.grant, a.bad === 1 ? { timeoutMs: a.h } as never : undefined),
      a.bad === 1 ? checking('options.timeoutMs', a.h, optInt(0, 2 ** 31 - 1)(a.h)) : undefined) // optionalInteger, before the CAS is posted
  },
  renew: (w, a) => {
    const g = pick(w.grants, a.i)
    if (!g) return
    if (a.bad === 0) {
      return void invoke(w, 'RemoteLockTable.renew', () => g.table.renew(a.h as never), checking('grant', a.h, TYPE))
    }
    const renewing = invoke(w, 'RemoteLockTable.renew', () => g.table.renew(g.grant))
    if (renewing instanceof Promise) renewing.then((grant: LockGrant) => { g.grant = grant }, () => {})
  },
  fence: (w, a) => {
    const g = pick(w.grants, a.i)
    if (!g || !w.lockSlices) return
    // The token (a bigint >= 1), then the fence word.
    if (a.bad === 0) invoke(w, 'RemoteLockTable.fence', () => g.table.fence(a.h as never, w.lockSlices!.fence), checking('token', a.h, typeof a.h === 'bigint' && a.h >= 1n ? undefined : TYPE))
    else if (a.bad === 1) invoke(w, 'RemoteLockTable.fence', () => g.table.fence(g.grant.token, a.h as never), checking('fenceWord', a.h, TYPE))
    else invoke(w, 'RemoteLockTable.fence', () => g.table.fence(g.grant.token, w.lockSlices!.fence, { timeoutMs: 2000 }))
  },
  closeLocks: (w, a) => {
    // Rarely: the QP under the tables closed while they acquire (each then fails coded, or is refused ERR_CLOSED).
    if (a.k % 8 === 0 && w.locksOpen) { w.locksOpen = false; invoke(w, 'close (lock table QP)', () => w.closeLocks!()) }
  },
  yield: () => {},
}
const WEIGHTS: Record<string, number> = { write: 5, read: 4, planned: 3, register: 3, unregister: 2, connect: 2, acquire: 3, release: 2, grant: 2, revoke: 2 }
const OP_NAMES = Object.keys(OPS).flatMap((name) => Array<string>(WEIGHTS[name] ?? 1).fill(name))


// --- a run ------------------------------------------------------------------

async function setUp(w: World, run: number): Promise<void> {
  w.run = run
  for (let i = 0; i < AGENTS; i++) {
    const name = `r${run}a${i}`
    w.names.push(name)
    const agent = await TransferAgent.create({ host: HOST, port: 0, name, qpsPerPeer: 1 + i % 2, stallTimeoutMs: 3000, handshakeTimeoutMs: 3000, queueDepth: 32 })
    w.agents.push(agent)
    // Peers that connect here: the handle names the agent by its name.
    agent.on('peer', (peer: Peer) => {
      const to = w.names.indexOf(peer.name)
      if (to >= 0 && !w.peers.some((p) => p.peer === peer)) w.peers.push({ at: i, peer, to })
    })
    agent.on('handshakeError', () => {})
  }
  const pair = await connectedPair(lockDevice, { size: 4096 })
  w.qp = pair.a.qp
  const remote = remoteRegion(pair.b.region.describe())
  w.lockSlices = { locks: remote.slice(0, 32), tokens: remote.slice(64, 32), fence: remote.slice(128, 8) }
  w.closeLocks = pair.close
  w.locksOpen = true
}

async function settle(w: World): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const watchdog = new Promise<'hang'>((resolve) => { timer = setTimeout(() => resolve('hang'), SETTLE_BOUND_MS) })
  const outcome = await Promise.race([Promise.all([...w.promises.keys()]), watchdog])
  clearTimeout(timer)
  if (outcome === 'hang') throw new Error(`no settlement within ${SETTLE_BOUND_MS} ms of closing: ${[...w.promises.values()].join(', ')}`)
}

async function tearDown(w: World, order: number[]): Promise<void> {
  for (const x of order) {
    w.closedAgents.add(x % AGENTS)
    invoke(w, 'TransferAgent.close', () => w.agents[x % AGENTS]!.close())
  }
  w.agents.forEach((agent, i) => { w.closedAgents.add(i); invoke(w, 'TransferAgent.close', () => agent.close()) })
  if (w.locksOpen) { w.locksOpen = false; invoke(w, 'close (lock table QP)', () => w.closeLocks!()) }
  await settle(w)
}

let lockDevice: Device
let before: Record<string, number>
const RESOURCES = ['ctx', 'pd', 'cq', 'qp', 'mr', 'cm_id'] as const
const resources = () => Object.fromEntries(RESOURCES.map((kind) => [kind, countResources(kind)]))

async function collectGarbage(): Promise<void> {
  for (let i = 0; i < 4; i++) {
    (globalThis as { gc?: () => void }).gc?.()
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

beforeAll(async () => {
  testDevice().close() // librdmacm's context per device, kept for the process: counted in `before`
  await keepLibrdmacmPd(HOST) // librdmacm's own PD of the device: kept, counted in `before`
  await collectGarbage()
  before = resources()
  lockDevice = testDevice()
})

afterAll(() => { lockDevice?.close() })

describe('fuzzing the transfer engine and the lock table', () => {
  it(`${RUNS} runs of ${ACTIONS} random calls on 3 agents and 2+ lock tables: coded errors with the right codes, settled, bytes right`, async () => {
    let calls = 0
    let verified = 0
    let verifiedBytes = 0
    let run = 0
    const started = performance.now()
    console.log(`fuzz-engine: seed ${SEED} (replay: FUZZ_SEED=${SEED})`)
    const property = fc.asyncProperty(
      fc.uint32Array({ minLength: ACTIONS * WORDS, maxLength: ACTIONS * WORDS }),
      fc.array(fc.nat(), { minLength: 0, maxLength: 4 }),
      async (words, closeOrder) => {
        const w = new World()
        try {
          await setUp(w, ++run)
          for (let x = 0; x < ACTIONS; x++) {
            const a = action(words, x * WORDS)
            const name = OP_NAMES[a.op % OP_NAMES.length]!
            if (TRACE) writeSync(2, `fuzz-engine trace: run ${run} action ${x} ${name} ${JSON.stringify({ ...a, h: show(a.h) })}\n`)
            OPS[name]!(w, a)
            // Let the handshakes, completions and control messages run between calls.
            if (name === 'yield' || x % 4 === 3) await new Promise((resolve) => setTimeout(resolve, x % 32 === 31 ? 5 : 0))
            if (w.failures.length > 0) throw w.failures[0]
            if (codes.mismatches.length > 0) throw codes.mismatches[0]
          }
          await tearDown(w, closeOrder)
          if (w.failures.length > 0) throw w.failures[0]
          if (codes.mismatches.length > 0) throw codes.mismatches[0]
        } finally {
          calls += w.calls
          verified += w.verified
          verifiedBytes += w.verifiedBytes
          for (const agent of w.agents) void agent.close()
          if (w.locksOpen) w.closeLocks?.()
        }
      },
    )
    try {
      // fc.check, not fc.assert: the counterexample (thousands of words) would bury the failure; the seed replays it.
      const result = await fc.check(property, { numRuns: RUNS, seed: SEED, endOnFailure: true })
      if (result.failed) {
        const cause = result.errorInstance as Error | undefined
        throw new Error(`fuzz-engine: run ${result.numRuns} of seed ${SEED} failed (replay: FUZZ_SEED=${SEED}): ${cause?.message ?? String(result.errorInstance)}`, { cause })
      }
    } finally {
      const seconds = (performance.now() - started) / 1000
      console.log(`fuzz-engine outcomes: ${[...outcomes].sort((x, y) => y[1] - x[1]).map(([k, v]) => `${k} ${v}`).join(', ')}`)
      for (const [call, m] of [...byCall].sort()) console.log(`fuzz-engine outcomes of ${call}: ${[...m].sort((x, y) => y[1] - x[1]).map(([k, v]) => `${k} ${v}`).join(', ')}`)
      console.log(`fuzz-engine: ${calls} calls in ${seconds.toFixed(1)} s (seed ${SEED}); ${verified} resolved transfers' bytes checked at the destination (${verifiedBytes} bytes); ${codes.summary()}`)
      console.log(`fuzz-engine: classes covered: ${[...new Set([...byCall.keys()].map((k) => k.split(/[. ]/)[0]))].sort().join(', ')}`)
    }
    expect(verified).toBeGreaterThan(0)
  }, 900_000)

  it('leaves no RDMA handle of this process open (rdma resource show)', async () => {
    lockDevice.close()
    await collectGarbage()
    await new Promise((resolve) => setTimeout(resolve, 500))
    await collectGarbage()
    // At most as many as before, per kind: an earlier file's garbage collected meanwhile lowers a count, a leak of this file raises it.
    const after = resources()
    console.log(`fuzz-engine: RDMA resources of this process before ${JSON.stringify(before)}, after ${JSON.stringify(after)}`)
    for (const kind of RESOURCES) expect(after[kind], kind).toBeLessThanOrEqual(before[kind]!)
  }, 120_000)
})
