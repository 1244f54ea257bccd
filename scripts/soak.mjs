#!/usr/bin/env node
// Soak: mixed RDMA operations on 16 QPs (8 connected RC pairs, both ends
// busy) with random sizes, every byte checked where it landed, for a fixed
// time. Every `interval` it prints RSS, open fds and the kernel's counts of
// this process's QPs, CQs, PDs and MRs (`rdma resource show`). It passes when
// all operations succeeded and no count grew from the first sample (RSS: not
// by more than `rssSlackMiB`, for the GC's breathing).
//
//   npm run soak                       10 minutes, a sample a minute (in the guest)
//   node scripts/soak.mjs --seconds 60 --interval 15   (needs an RDMA device)
// test/rdma/110.soak.test.ts runs 60 s of it in `npm test`.
import { execFileSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { randomBytes, randomInt } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import { Access, openDevice } from '../dist/index.js'

const KiB = 1024
const REGION = 512 * KiB
const SOURCE = 0 // [0, 128 KiB): what this side sends
const READBACK = 128 * KiB // [128, 256 KiB): where reads land
const INCOMING = 256 * KiB // [256, 384 KiB): what the peer writes and sends here
const COUNTER = 384 * KiB // 8 bytes: the peer's fetch-and-add target
const SWAP = COUNTER + 8 // 8 bytes: the peer's compare-and-swap target
const MAX_SIZE = 64 * KiB
const ACCESS = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic
const OPS = ['write', 'write', 'read', 'read', 'send', 'send', 'batch', 'fetchAndAdd', 'compareAndSwap']

/** Kernel RDMA objects of this process, by kind. */
export function kernelCounts() {
  const count = (kind) => {
    const rows = JSON.parse(execFileSync('rdma', ['-j', 'resource', 'show', kind], { encoding: 'utf8', timeout: 30_000 }) || '[]')
    return rows.filter((row) => row.pid === process.pid).length
  }
  return { qp: count('qp'), cq: count('cq'), pd: count('pd'), mr: count('mr') }
}

function sample(startedAt, totals) {
  globalThis.gc?.() // RSS after a collection: garbage is not a leak
  return {
    at: startedAt,
    seconds: Math.round((Date.now() - startedAt) / 1000),
    rssMiB: Math.round(process.memoryUsage().rss / (1 << 20) * 10) / 10,
    fds: readdirSync('/proc/self/fd').length,
    ...kernelCounts(),
    ops: totals.ops,
    bytesVerified: totals.bytes,
  }
}

function check(condition, message) {
  if (!condition) throw new Error(message)
}

function u64(bytes, offset) {
  return new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(offset, true)
}

/** One QP's loop: random operations against its peer while `running()`; every landed byte compared. */
async function drive(me, peer, running, totals, bounded) {
  const remote = peer.region.asRemote()
  let counter = 0n
  let swap = 0n
  while (running() && !totals.error) {
    const op = OPS[randomInt(OPS.length)]
    const length = randomInt(1, MAX_SIZE + 1)
    const offset = randomInt(0, 128 * KiB - length + 1)
    const bytes = randomBytes(length)
    me.region.bytes.set(bytes, SOURCE + offset)
    const landed = (region, at) => Buffer.compare(region.bytes.subarray(at, at + length), bytes) === 0
    if (op === 'write') {
      await me.qp.write(me.region.slice(SOURCE + offset, length), remote.slice(INCOMING + offset, length), bounded)
      check(landed(peer.region, INCOMING + offset), `write of ${length} bytes: the peer holds other bytes`)
    } else if (op === 'read') {
      await me.qp.write(me.region.slice(SOURCE + offset, length), remote.slice(INCOMING + offset, length), bounded)
      me.region.bytes.fill(0, READBACK + offset, READBACK + offset + length)
      await me.qp.read(me.region.slice(READBACK + offset, length), remote.slice(INCOMING + offset, length), bounded)
      check(landed(me.region, READBACK + offset), `read of ${length} bytes: other bytes came back`)
      totals.bytes += length // the write before it
    } else if (op === 'send') {
      const received = peer.qp.recv(peer.region.slice(INCOMING + offset, length), bounded)
      received.catch(() => {}) // awaited below; if the send fails first, its timeout must not go unhandled
      await me.qp.send(me.region.slice(SOURCE + offset, length), bounded)
      const wc = await received
      check(wc.byteLength === length && landed(peer.region, INCOMING + offset), `send of ${length} bytes: ${wc.byteLength} arrived, or other bytes`)
    } else if (op === 'batch') {
      // Four writes of parts of the source in one post: one doorbell.
      const part = Math.max(1, Math.floor(length / 4))
      const parts = [0, 1, 2, 3].map((i) => [i * part, i === 3 ? length - 3 * part : part]).filter(([, n]) => n > 0)
      await me.qp.postBatch(parts.map(([at, n]) => ({ op: 'write', local: me.region.slice(SOURCE + offset + at, n), remote: remote.slice(INCOMING + offset + at, n) })), bounded)
      check(landed(peer.region, INCOMING + offset), `batch of ${parts.length} writes (${length} bytes): the peer holds other bytes`)
    } else if (op === 'fetchAndAdd') {
      const add = BigInt(length)
      const previous = await me.qp.fetchAndAdd(remote.slice(COUNTER, 8), add, bounded)
      check(previous === counter, `fetch-and-add returned ${previous}, expected ${counter}`)
      counter += add
      check(u64(peer.region.bytes, COUNTER) === counter, 'fetch-and-add: the counter holds another value')
    } else {
      const next = BigInt(length) * 7919n
      const previous = await me.qp.compareAndSwap(remote.slice(SWAP, 8), swap, next, bounded)
      check(previous === swap, `compare-and-swap returned ${previous}, expected ${swap}`)
      swap = next
      check(u64(peer.region.bytes, SWAP) === swap, 'compare-and-swap: the slot holds another value')
    }
    if (op !== 'fetchAndAdd' && op !== 'compareAndSwap') totals.bytes += length
    else totals.bytes += 8
    totals.ops++
  }
}

/**
 * Under AddressSanitizer (its runtime preloaded, as `npm run test:asan` does)
 * freed memory waits in a quarantine before it is reused, so RSS grows by up
 * to the quarantine's size with nothing leaked: that much more RSS is allowed
 * there. The object counts (fds, QP, CQ, PD, MR) stay exact either way.
 */
function sanitizerQuarantineMiB(env) {
  if (!/libasan/.test(env.LD_PRELOAD ?? '')) return 0
  const option = /(?:^|:)quarantine_size_mb=(\d+)/.exec(env.ASAN_OPTIONS ?? '')
  return option ? Number(option[1]) : 256 // ASan's default on 64-bit Linux
}

/**
 * What grew from the first sample to any later one: an fd or kernel object
 * count at all, RSS by more than `rssSlackMiB` (plus ASan's quarantine when
 * `env` preloads it). Empty when nothing did.
 */
export function growthOf(samples, rssSlackMiB, env = process.env) {
  const first = samples[0]
  const growth = []
  const slack = rssSlackMiB + sanitizerQuarantineMiB(env)
  for (const s of samples.slice(1)) {
    for (const key of ['fds', 'qp', 'cq', 'pd', 'mr']) if (s[key] > first[key]) growth.push(`${key} ${first[key]} -> ${s[key]} at ${s.seconds}s`)
    if (s.rssMiB > first.rssMiB + slack) growth.push(`rss ${first.rssMiB} -> ${s.rssMiB} MiB at ${s.seconds}s (slack ${slack} MiB)`)
  }
  return growth
}

/**
 * Runs the soak; resolves with { ok, samples, ops, bytesVerified, error, growth }.
 * `log` gets one line per sample.
 */
export async function soak({ seconds = 60, interval = 15, pairs = 8, rssSlackMiB = 32, device: name, log = console.log } = {}) {
  const device = openDevice(name ?? (process.env.SOFTROCE_DEVICE || undefined))
  const sides = []
  const make = () => {
    const pd = device.allocPd()
    const cq = device.createCq({ entries: 1024 })
    const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 64, maxRecvWr: 64 })
    const region = pd.allocRegion(REGION, ACCESS)
    return { pd, cq, qp, region }
  }
  const totals = { ops: 0, bytes: 0, error: undefined }
  const bounded = { timeoutMs: 60_000 }
  const samples = []
  try {
    for (let i = 0; i < pairs; i++) {
      const a = make()
      const b = make()
      await a.qp.connect(b.qp.endpoint())
      await b.qp.connect(a.qp.endpoint())
      sides.push([a, b], [b, a])
    }
    const startedAt = Date.now()
    // Warm-up (a tenth of the run, at most one interval): JIT, heap and the
    // lazily registered atomic scratch pages settle before the baseline.
    const warmup = Math.min(interval, seconds / 10) * 1000
    const deadline = startedAt + warmup + seconds * 1000
    // A fixed number of samples, on a schedule from the start: a slow (or
    // busy) machine takes them late, never fewer. Traffic runs until the
    // last one is taken and the time is up.
    const count = Math.max(1, Math.floor(seconds / interval))
    let sampled = false
    const running = () => !sampled || Date.now() < deadline
    const loops = sides.map(([me, peer]) => drive(me, peer, running, totals, bounded).catch((error) => { totals.error ??= error }))
    const sampler = (async () => {
      const t0 = startedAt + warmup
      for (let k = 0; k < count && !totals.error; k++) {
        const wait = t0 + k * interval * 1000 - Date.now()
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
        const s = sample(t0, totals)
        samples.push(s)
        log(`[soak] t=${s.seconds}s rss=${s.rssMiB}MiB fds=${s.fds} qp=${s.qp} cq=${s.cq} pd=${s.pd} mr=${s.mr} ops=${s.ops} bytesVerified=${s.bytesVerified}`)
      }
      sampled = true
    })()
    await Promise.all([...loops, sampler])
    // The end state, after the last operation, is the sample that matters most.
    if (!totals.error && samples.length > 0) {
      const s = sample(samples[0].at, totals)
      samples.push(s)
      log(`[soak] end t=${s.seconds}s rss=${s.rssMiB}MiB fds=${s.fds} qp=${s.qp} cq=${s.cq} pd=${s.pd} mr=${s.mr} ops=${s.ops} bytesVerified=${s.bytesVerified}`)
    }
  } catch (error) {
    totals.error ??= error
  } finally {
    for (const [side] of sides) { side.qp.close(); side.cq.close(); side.pd.close() }
    device.close()
  }
  const growth = growthOf(samples, rssSlackMiB)
  const error = totals.error ? String(totals.error.stack ?? totals.error) : undefined
  const ok = !error && samples.length >= 2 && growth.length === 0
  return { ok, seconds, pairs, qps: pairs * 2, samples, ops: totals.ops, bytesVerified: totals.bytes, error, growth }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const arg = (name, fallback) => {
    const i = process.argv.indexOf(`--${name}`)
    return i > 0 ? Number(process.argv[i + 1]) : fallback
  }
  const result = await soak({ seconds: arg('seconds', 600), interval: arg('interval', 60) })
  const { samples, ...summary } = result
  console.log(JSON.stringify({ ...summary, first: samples[0], last: samples.at(-1) }, null, 2))
  console.log(result.ok ? '[soak] PASS' : `[soak] FAIL ${result.error ?? result.growth.join('; ')}`)
  process.exit(result.ok ? 0 : 1)
}
