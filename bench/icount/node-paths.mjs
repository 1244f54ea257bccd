// Guest side of `npm run bench -- icount`: each path of the library, warmed
// up, then run N times between two icount markers (bench/icount/marker.c).
// Prints one line per region, in order: `@icount {"label", "n", "us", ...}`
// (µs per operation: the N operations timed as a whole; under the plugin the
// guest runs slower, so only ratios mean something).
//   node bench/icount/node-paths.mjs MARKER_NODE [--n 4000] [--warm-s 4] [--only label,...] [--dist DIR --tag NAME] [--cold]
// --cold: a fresh process's first operations instead: each path's operations
// 1-10, 11-100 and 101-1000 counted as they come (no warm-up before), then
// the same path warmed up as usual (run one path per process: icount.mjs
// --cold does).
// --dist: another build of the library (a directory holding index.js; its
// addon named by NODE_IBVERBS_ADDON), so that several versions are counted in
// one boot; --tag prefixes their labels.
import { createRequire } from 'node:module'
import { performance } from 'node:perf_hooks'
import { pathToFileURL } from 'node:url'
import { resolve } from 'node:path'
import { connectedPair } from '../pair.mjs'
import { floorPair as verbsFloorPair } from '../notify-floor.mjs'
import { pingPongPair } from '../notify-pingpong.mjs'

const args = process.argv.slice(2)
const { mark } = createRequire(import.meta.url)(args[0])
const opt = (name, fallback) => { const i = args.indexOf(name); return i < 0 ? fallback : args[i + 1] }
const N = Number(opt('--n', 4000))
const warmMs = Number(opt('--warm-s', 4)) * 1000
const only = opt('--only', undefined)?.split(',')
const dist = opt('--dist', undefined)
const tag = opt('--tag', undefined)
const cold = args.includes('--cold')
const lib = (file) => dist ? pathToFileURL(resolve(dist, file)).href : `../../dist/${file}`
const { openDevice, TransferAgent, RemoteLockTable } = await import(lib('index.js'))
/** The first of `files` the build has: a variant may predate lib/'s folders (2026-12-03). */
async function libModule(...files) {
  for (const file of files) {
    try {
      return await import(lib(file))
    } catch (error) {
      if (error.code !== 'ERR_MODULE_NOT_FOUND' || file === files.at(-1)) throw error
    }
  }
}
const { WorkRequestEncoder } = await libModule('ops/encoder.js', 'work-request-encoding.js')
const { WrOpcode, SendFlags } = await libModule('core/constants.js', 'constants.js')

const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const busy = await connectedPair(device, 'busy')
const event = await connectedPair(device, 'event')
const engine = await enginePair()
const floor = await floorPair()

/** What the engine posts for a notified 4 KiB write, by the verbs layer alone (bench/notify-floor.mjs times it). */
async function floorPair() {
  const { Access } = await import(lib('index.js'))
  const { c, s, batch, inbox } = await verbsFloorPair(device, Access)
  const b16 = await verbsFloorPair(device, Access, { size: 65536, blocks: 16 })
  return {
    notified: () => Promise.all([s.qp.recv(inbox), c.qp.postBatch(batch)]),
    notified16: () => Promise.all([b16.s.qp.recv(b16.inbox), b16.c.qp.postBatch(b16.batch)]),
  }
}

/**
 * Two transfer agents in this process, 1 QP per peer, a 4 KiB block: the
 * engine's rows count both sides (the initiator's write and the target's
 * notification handler), as one machine running both would.
 */
async function enginePair() {
  const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
  if (!TransferAgent) return undefined
  const target = await TransferAgent.create({ host, port: 0, qpsPerPeer: 1 })
  const initiator = await TransferAgent.create({ host, port: 0, qpsPerPeer: 1 })
  target.register('kv', { size: 1 << 17, remote: 'write' })
  const src = initiator.register('src', { size: 1 << 17 })
  const peer = await initiator.connect({ host, port: target.port })
  while (!peer.segments.has('kv')) await new Promise((r) => setTimeout(r, 10))
  let arrived
  target.on('notification', () => arrived())
  const block = [{ local: [src, 0], remote: ['kv', 0], length: 4096 }]
  // 16 blocks of 4 KiB with a gap after each (none coalesces): bench/transfer.mjs's 64 KiB latency case.
  const blocks16 = Array.from({ length: 16 }, (_, i) => ({ local: [src, 8192 * i], remote: ['kv', 8192 * i], length: 4096 }))
  const notified = { notify: 'n' }
  const plan16 = initiator.prepare(peer, 'write', blocks16)
  return {
    write: () => initiator.write(peer, block),
    notified: () => Promise.all([new Promise((r) => { arrived = r }), initiator.write(peer, block, notified)]),
    notified16: () => Promise.all([new Promise((r) => { arrived = r }), initiator.write(peer, blocks16, notified)]),
    prepared16: () => Promise.all([new Promise((r) => { arrived = r }), plan16.run(notified)]),
    prepare1: () => initiator.prepare(peer, 'write', block),
    prepare16: () => initiator.prepare(peer, 'write', blocks16),
    close: () => { initiator.close(); target.close() },
  }
}

/** Two-process ping-pongs started (closed at the end). */
const pingPongs = []
/**
 * One round trip of bench/notify-pingpong.mjs (`layer`: 'engine' or 'verbs',
 * event CQs, 1 QP): this process's notified write of 4 KiB and the echo
 * process's answer. The plugin counts both processes, as it counts every
 * vCPU. `setup` starts the echo (only for a row that runs).
 */
function pingPongRow(layer) {
  let pair
  let i = 0
  return {
    setup: async () => { pingPongs.push(pair = await pingPongPair({ layer, dist, warmS: 0 })) },
    async: () => pair.round(i++),
  }
}

/** The raw path: encode one READ into a Uint32Array, post it, poll until its completion. */
function rawRead({ c, s }) {
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const enc = new WorkRequestEncoder()
  const qp = c.qp.handle, cq = c.cq.handle
  let wrId = 1e9
  let polls = 0
  const one = () => {
    enc.reset()
    enc.addSend({ wrId: wrId++, opcode: WrOpcode.RdmaRead, flags: SendFlags.Signaled, sges: [{ address: local.address, length: 8, lkey: local.lkey }], remoteHi: remote.addrHi, remoteLo: remote.addrLo, rkey: remote.rkey })
    qp.postSend(enc.buffer, enc.count)
    for (;;) { polls++; if (cq.poll() > 0) break }
  }
  return { sync: one, stats: () => ({ polls }) }
}

/** The raw path as the library now takes it: addOne into a buffer bound once to a plain post function that polls in the same call. */
function rawBoundRead({ c, s }) {
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const enc = new WorkRequestEncoder()
  const post = c.qp.handle.sendPoster(enc.buffer, c.cq.handle)
  const poll = c.cq.handle.poller()
  const address = local.address, lkey = local.lkey, lo = remote.addrLo, hi = remote.addrHi, rkey = remote.rkey
  let wrId = 2e9
  let polls = 0
  const one = () => {
    enc.reset()
    enc.addOne(wrId++, WrOpcode.RdmaRead, SendFlags.Signaled, address, 8, lkey, lo, hi, rkey, 0)
    polls++
    if (post(0, 1, 1) > 0) return
    for (;;) { polls++; if (poll() > 0) break }
  }
  return { sync: one, stats: () => ({ polls }) }
}

/**
 * The lower-level completion path (qp.postRead + the QP's completion handler):
 * `sync` posts and spins on cq.poll() until the handler ran, as a C loop does;
 * `chain` runs n READs back to back, each posted by the handler of the last.
 */
function tagged({ c, s }) {
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  let reported = 0
  let onReport
  c.qp.setCompletionHandler((tag, error) => {
    if (error) throw error
    reported++
    onReport?.()
  })
  const sync = (post) => () => {
    const want = reported + 1
    post(local, remote, 1)
    while (reported < want) c.cq.poll()
  }
  const chain = (n) => new Promise((resolve) => {
    let left = n
    onReport = () => {
      if (--left > 0) return c.qp.postRead(local, remote, 2)
      onReport = undefined
      resolve()
    }
    c.qp.postRead(local, remote, 2)
  })
  return { read: sync((l, r, t) => c.qp.postRead(l, r, t)), write: sync((l, r, t) => c.qp.postWrite(l, r, t)), fadd: sync((l, r, t) => c.qp.postFetchAndAdd(l, r, 1n, t)), chain }
}

function paths() {
  const { c, s } = busy
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const atomicRemote = s.mr.asRemote().slice(64, 8)
  const atomicRemote2 = s.mr.asRemote().slice(512, 8), atomicRemote3 = s.mr.asRemote().slice(520, 8) // clear of the batch rows (bytes 0..255)
  const ev = { local: event.c.mr.slice(0, 8), remote: event.s.mr.asRemote().slice(0, 8) }
  const batchOf = ({ c, s }) => Array.from({ length: 32 }, (_, i) => ({ op: 'write', local: c.mr.slice(8 * i, 8), remote: s.mr.asRemote().slice(8 * i, 8) }))
  const batch = batchOf(busy), eventBatch = batchOf(event)
  return [
    { label: 'raw read: encode + postSend + poll (ObjectWrap methods)', ...rawRead(busy) },
    ...(typeof c.qp.handle.sendPoster === 'function' ? [{ label: 'raw read: addOne + bound post(wordStart, 1, poll)', ...rawBoundRead(busy) }] : []),
    ...(typeof c.qp.setCompletionHandler === 'function' ? taggedRows() : []),
    { label: 'empty poll: cq.poll()', sync: () => c.cq.poll(), scale: 10 },
    { label: 'empty poll: native poll()', sync: () => c.cq.handle.poll(), scale: 10 },
    { label: 'await qp.read() (busy CQ)', async: () => c.qp.read(local, remote) },
    { label: 'await qp.write() (busy CQ)', async: () => c.qp.write(local, remote) },
    { label: 'await qp.read() (event CQ)', async: () => event.c.qp.read(ev.local, ev.remote) },
    { label: 'await qp.write() (event CQ)', async: () => event.c.qp.write(ev.local, ev.remote) },
    // As many batches as single requests elsewhere: 94 batches left V8 compiling them inside the counted region.
    { label: 'postBatch of 32 writes, per write (busy CQ)', async: () => c.qp.postBatch(batch), per: 32, scale: 32 },
    { label: 'postBatch of 32 writes, per write (event CQ)', async: () => event.c.qp.postBatch(eventBatch), per: 32, scale: 32 },
    { label: 'await qp.compareAndSwap()', async: () => c.qp.compareAndSwap(atomicRemote, 0n, 0n) },
    { label: 'await qp.fetchAndAdd()', async: () => c.qp.fetchAndAdd(atomicRemote, 1n) },
    // The same two verbs with the other's operands (a CAS whose words are not 0, a FAA that adds 0 to 0):
    // does the gap between them come from the verb or from BigInt arithmetic on non-zero values?
    { label: 'await qp.compareAndSwap() (non-zero operands)', async: () => c.qp.compareAndSwap(atomicRemote2, 0x1_0000_0001n, 0x2_0000_0002n) },
    { label: 'await qp.fetchAndAdd() (adds 0 to 0)', async: () => c.qp.fetchAndAdd(atomicRemote3, 0n) },
    ...(RemoteLockTable ? [lockRow()] : []),
    ...(engine ? [
      { label: 'engine: await write() of 4 KiB, 1 QP (both agents)', async: engine.write },
      { label: 'engine: notified write of 4 KiB, 1 QP, until the target\'s handler ran and write() resolved (both agents)', async: engine.notified },
      { label: 'engine: notified write of 16 x 4 KiB, 1 QP, until the target\'s handler ran and write() resolved (both agents)', async: engine.notified16, scale: 0.25 },
      { label: 'engine: notified run() of a prepared plan of 16 x 4 KiB, 1 QP, until the target\'s handler ran and run() resolved (both agents)', async: engine.prepared16, scale: 0.25 },
      // What write() checks and plans before posting, alone (a list of { local, remote, length }).
      { label: 'engine: prepare() of 1 block', sync: engine.prepare1 },
      { label: 'engine: prepare() of 16 blocks', sync: engine.prepare16 },
    ] : []),
    { label: 'verbs floor of a notified write: WRITE 4 KiB + SEND_WITH_IMM by postBatch, until recv() and the batch resolved (event CQs)', async: floor.notified },
    { label: 'verbs floor of a notified write of 16 x 4 KiB: 16 WRITEs + SEND_WITH_IMM by postBatch, until recv() and the batch resolved (event CQs)', async: floor.notified16, scale: 0.25 },
    // Two fresh processes: V8 compiles both for well over 5 s in the guest (docs/benchmarks.md, "Notified writes").
    ...(TransferAgent ? [{ label: 'engine: notified 4 KiB write in ping-pong between two processes, per round trip (event CQs, 1 QP; both processes)', ...pingPongRow('engine'), warmMs: 30_000 }] : []),
    { label: 'verbs floor in ping-pong between two processes: WRITE 4 KiB + SEND_WITH_IMM by postBatch, per round trip (event CQs; both processes)', ...pingPongRow('verbs'), warmMs: 30_000 },
  ]
}

/** A lock table in the busy pair's region (words 1024..1087, counters 1088..1151): one client, one lock, nothing else. */
function lockRow() {
  const table = busy.s.mr.asRemote()
  const locks = new RemoteLockTable(busy.c.qp, { locks: table.slice(1024, 64), tokens: table.slice(1088, 64), owner: 1, leaseMs: 60_000 })
  return { label: 'lock: uncontended acquire + release (busy CQ)', async: async () => locks.release(await locks.acquire(3)) }
}

function taggedRows() {
  const onBusy = tagged(busy)
  const onEvent = tagged(event)
  return [
    { label: 'tagged read: qp.postRead + cq.poll() until reported', sync: onBusy.read },
    { label: 'tagged write: qp.postWrite + cq.poll() until reported', sync: onBusy.write },
    ...(typeof busy.c.qp.postFetchAndAdd === 'function' ? [{ label: 'tagged fetchAndAdd: qp.postFetchAndAdd + cq.poll() until reported', sync: onBusy.fadd }] : []),
    { label: 'tagged read chain, reported from the event loop (busy CQ)', chain: onBusy.chain },
    { label: 'tagged read chain, reported from the event loop (event CQ)', chain: onEvent.chain },
  ]
}

/**
 * A loop of its own for each path (a fresh function, so its own feedback and
 * optimized code): one loop shared by every path turns polymorphic, and V8's
 * background compiler then recompiles it inside the counted regions.
 */
function loopFor(path) {
  if (path.chain) return path.chain
  // eslint-disable-next-line no-new-func
  return path.sync ? new Function('f', 'n', 'for (let i = 0; i < n; i++) f()').bind(null, path.sync)
    : new Function('f', 'n', 'return (async () => { for (let i = 0; i < n; i++) await f() })()').bind(null, path.async)
}

for (const path of paths()) {
  if (only && !only.some((o) => path.label.includes(o))) continue
  const per = path.per ?? 1
  const n = Math.max(50, Math.round((N * (path.scale ?? 1)) / per)) // cheap paths run longer: a region's fixed noise is spread thinner
  await path.setup?.()
  const run = loopFor(path)
  const name = tag ? `[${tag}] ${path.label}` : path.label
  if (cold) {
    // The first operations of this process, as they come: the interpreter, then V8's tiers catching up.
    for (const [from, to] of [[1, 10], [11, 100], [101, 1000]]) {
      const count = to - from + 1
      const t0 = performance.now()
      mark(1)
      await run(count)
      mark(2)
      const us = ((performance.now() - t0) * 1000) / count
      console.log('@icount ' + JSON.stringify({ label: `${name} [cold: ops ${from}-${to}]`, n: count * per, us }))
    }
  }
  // Warm-up: V8 optimizes the path before it is counted. By operations, then by time: its
  // optimizing compiler runs on a background thread, slow in the guest, and the plugin counts
  // every vCPU, so a compile that lands in a counted region is counted as the path's.
  await run(n)
  await run(n)
  for (const t0 = performance.now(), ms = path.warmMs ?? warmMs; performance.now() - t0 < ms;) await run(Math.min(n, 500))
  // Counted three times: the host keeps the smallest. V8's compiler thread may still be optimizing
  // functions that became hot late (seen after 20-40 s of warm-up), and a compile that lands in a
  // region is counted as the path's: with two counts both were caught at times (+50k on a 55k row).
  for (let count = 0; count < 3; count++) {
    const before = path.stats?.()
    const t0 = performance.now()
    mark(1)
    await run(n)
    mark(2)
    const us = ((performance.now() - t0) * 1000) / (n * per)
    const after = path.stats?.()
    const extra = before && after ? { polls: (after.polls - before.polls) / n } : {}
    console.log('@icount ' + JSON.stringify({ label: cold ? `${name} [warm]` : name, n: n * per, us, ...extra }))
  }
}
engine?.close()
for (const pair of pingPongs) await pair.close()
device.close()
if (args.includes('--maps')) {
  // For --profile: what the host needs to name the profile's addresses (V8's
  // JIT code from --perf-basic-prof's map, libraries from our mappings).
  const { readFileSync } = await import('node:fs')
  for (const line of readFileSync('/proc/self/maps', 'utf8').split('\n')) if (/ r-xp /.test(line)) console.log('@maps ' + line)
  for (const line of readFileSync(`/tmp/perf-${process.pid}.map`, 'utf8').split('\n')) if (line) console.log('@perfmap ' + line)
}
