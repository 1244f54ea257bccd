// Node equivalents of perftest's ib_*_bw and ib_*_lat tests, with both queue
// pairs on one device in one process (like perftest's server and client on
// one rxe device). Used by `node-ibverbs bench` and by bench/run.mjs.
import { performance } from 'node:perf_hooks'
import { Access, openDevice, type CompletionQueue, type Device, type MemoryRegion, type QueuePair } from '../index.js'

export const BW_TESTS = ['write_bw', 'read_bw', 'send_bw', 'atomic_fadd_bw', 'atomic_cas_bw'] as const
export const LAT_TESTS = ['write_lat', 'read_lat', 'send_lat'] as const
export const TESTS = [...BW_TESTS, ...LAT_TESTS] as const
export type TestName = (typeof TESTS)[number]

/** perftest reports bandwidth in MB/sec with MB = 2^20 bytes. */
export const MB = 1 << 20

export interface BenchOptions {
  test: TestName
  /** Message size in bytes (atomics: always 8). */
  size: number
  /** Operations to time (after warm-up). */
  iters: number
  poll: 'event' | 'busy'
  /** Bandwidth tests: post with postBatch(completions: 'last') instead of one promise per op. */
  batch: boolean
  /** Operations (work requests) kept outstanding (perftest -t, default 128). */
  txDepth: number
  /** Work requests per postBatch call when batching (default txDepth / 4). */
  batchSize?: number
  /** Warm-up operations, not timed (default min(iters / 10, 1000)). */
  warmup?: number
  /**
   * Runs the test untimed for this long first (default 0), in the same
   * process on the same queue pairs: V8 optimizes on a background thread
   * over the first seconds, so a short warm-up measures the interpreter.
   */
  warmupMs?: number
  device?: string
  /** Called now and then with the fraction done (0..1). */
  progress?: (fraction: number) => void
}

export interface BwResult {
  kind: 'bw'
  test: TestName
  size: number
  iters: number
  seconds: number
  /** MB/sec, MB = 2^20 bytes (as perftest). */
  mbPerSec: number
  mpps: number
}

export interface LatResult {
  kind: 'lat'
  test: TestName
  size: number
  iters: number
  /** In microseconds; write_lat and send_lat report half the round trip, as perftest does. */
  tMin: number
  tMax: number
  tTypical: number
  tAvg: number
  p99: number
  p999: number
}

export type BenchResult = BwResult | LatResult

const ACCESS = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic

interface Side { cq: CompletionQueue; qp: QueuePair; mr: MemoryRegion }
interface Pair { device: Device; client: Side; server: Side; close(): void }

async function setup(o: BenchOptions, regionSize: number): Promise<Pair> {
  const device = openDevice(o.device ?? process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE ?? undefined)
  const pd = device.allocPd()
  const depth = Math.max(o.txDepth, 16)
  const side = (): Side => {
    const cq = device.createCq({ entries: depth * 4 + 64, pollMode: o.poll })
    const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: depth, maxRecvWr: depth * 2, maxInlineData: 0 })
    const mr = pd.allocRegion(Math.max(regionSize, 64), ACCESS)
    return { cq, qp, mr }
  }
  const client = side()
  const server = side()
  await client.qp.connect(server.qp.endpoint())
  await server.qp.connect(client.qp.endpoint())
  return { device, client, server, close: () => device.close() }
}

export async function runBench(o: BenchOptions): Promise<BenchResult> {
  const size = o.test.startsWith('atomic') ? 8 : o.size
  const opts = { ...o, size }
  // Latency tests use two halves per side: a send half and a receive half.
  const pair = await setup(opts, o.test.endsWith('_lat') ? size * 2 : size)
  try {
    const run = testOf(o.test)
    if (o.warmupMs !== undefined && o.warmupMs > 0) {
      const end = performance.now() + o.warmupMs
      // Rounds of at least 4 x the depth: send_bw leaves 2 x depth receives posted after each.
      const iters = o.test.endsWith('_bw') ? Math.max(4 * o.txDepth, Math.min(o.iters, 1000)) : Math.min(o.iters, 500)
      const rounds = { ...opts, iters, warmup: 0, progress: undefined }
      while (performance.now() < end) await run(pair, rounds)
    }
    return await run(pair, opts)
  } finally {
    pair.close()
  }
}

function testOf(test: TestName): (pair: Pair, o: BenchOptions) => Promise<BenchResult> {
  switch (test) {
    case 'write_bw': case 'read_bw': case 'send_bw': case 'atomic_fadd_bw': case 'atomic_cas_bw':
      return bandwidth
    case 'write_lat': return writeLatency
    case 'read_lat': return readLatency
    case 'send_lat': return sendLatency
  }
  throw new Error(`unknown test ${String(test)}`)
}

// --- bandwidth --------------------------------------------------------------

async function bandwidth(pair: Pair, o: BenchOptions): Promise<BwResult> {
  const { client, server } = pair
  const size = o.size
  const local = client.mr.slice(0, size)
  const remote = server.mr.asRemote().slice(0, size)
  const counter = server.mr.asRemote().slice(0, 8)
  const depth = o.txDepth
  const batchSize = Math.max(1, Math.min(o.batchSize ?? Math.max(1, depth >> 2), depth))
  const isAtomic = o.test === 'atomic_fadd_bw' || o.test === 'atomic_cas_bw'
  if (o.batch && isAtomic) throw new Error('postBatch() has no atomic operations: atomic tests run unbatched only')

  // send_bw: keep receives posted on the server, reposting as they complete.
  let stopRecv = false
  let recvError: Error | undefined
  if (o.test === 'send_bw') {
    const rslice = server.mr.slice(0, size)
    const repost = (): void => {
      if (stopRecv) return
      server.qp.recv(rslice).then(repost, (e: Error) => { if (!stopRecv) recvError = e })
    }
    for (let i = 0; i < depth * 2; i++) repost()
  }

  const op = o.test === 'write_bw' ? 'write' : o.test === 'read_bw' ? 'read' : 'send'
  const one = (): Promise<unknown> => {
    switch (o.test) {
      case 'write_bw': return client.qp.write(local, remote)
      case 'read_bw': return client.qp.read(local, remote)
      case 'send_bw': return client.qp.send(local)
      case 'atomic_fadd_bw': return client.qp.fetchAndAdd(counter, 1n)
      default: return client.qp.compareAndSwap(counter, 0n, 0n)
    }
  }
  const batchOps = Array.from({ length: batchSize }, () =>
    op === 'send' ? { op: 'send' as const, local } : { op: op as 'write' | 'read', local, remote })

  // Runs `count` operations with `depth` of them outstanding; resolves when all completed.
  const run = (count: number, report?: (done: number) => void): Promise<void> => new Promise((resolve, reject) => {
    let posted = 0
    let done = 0
    let failed = false
    const fail = (e: Error) => { if (!failed) { failed = true; reject(e) } }
    const unit = o.batch ? batchSize : 1
    let nextReport = 0
    const onDone = (n: number) => {
      done += n
      if (report && done >= nextReport) { report(done); nextReport = done + Math.max(1, count >> 6) }
      if (recvError) return fail(recvError)
      if (done >= count) return resolve()
      issue()
    }
    const issue = () => {
      while (!failed && posted < count && posted - done + Math.min(unit, count - posted) <= depth) {
        const n = Math.min(unit, count - posted)
        posted += n
        const p = o.batch ? client.qp.postBatch(n === batchSize ? batchOps : batchOps.slice(0, n), { completions: 'last' }) : one()
        p.then(() => onDone(n), fail)
      }
    }
    if (count === 0) return resolve()
    issue()
  })

  const warmup = o.warmup ?? Math.min(Math.floor(o.iters / 10), 1000)
  await run(warmup)
  const t0 = performance.now()
  await run(o.iters, o.progress ? (d) => o.progress!(d / o.iters) : undefined)
  const seconds = (performance.now() - t0) / 1000
  stopRecv = true
  return {
    kind: 'bw', test: o.test, size: o.size, iters: o.iters, seconds,
    mbPerSec: (o.size * o.iters) / seconds / MB,
    mpps: o.iters / seconds / 1e6,
  }
}

// --- latency ----------------------------------------------------------------

function latencyResult(o: BenchOptions, samples: Float64Array): LatResult {
  const sorted = Float64Array.from(samples).sort()
  const n = sorted.length
  const at = (q: number) => sorted[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))]!
  let sum = 0
  for (const s of sorted) sum += s
  return {
    kind: 'lat', test: o.test, size: o.size, iters: n,
    tMin: sorted[0]!, tMax: sorted[n - 1]!, tTypical: sorted[n >> 1]!, tAvg: sum / n, p99: at(0.99), p999: at(0.999),
  }
}

/** Spins until bytes[index] === value (the device writes it); throws after `limitMs`. */
function spinFor(bytes: Uint8Array, index: number, value: number, limitMs = 5000): void {
  if (bytes[index] === value) return
  const deadline = performance.now() + limitMs
  for (let i = 0; ; i++) {
    if (bytes[index] === value) return
    if ((i & 0xfff) === 0 && performance.now() > deadline) throw new Error(`no data after ${limitMs} ms (byte ${index} != ${value})`)
  }
}

/**
 * ib_write_lat: each side WRITEs to the other and polls its own memory for
 * the last byte of the message (the iteration number); latency = RTT / 2.
 * Both sides run on one thread here: the client's write, the server's spin
 * on its memory, the server's write back, the client's spin.
 */
async function writeLatency(pair: Pair, o: BenchOptions): Promise<LatResult> {
  const { client, server } = pair
  const size = o.size
  const last = size - 1
  const cl = client.mr.slice(0, size), sl = server.mr.slice(0, size)
  const toServer = server.mr.asRemote().slice(size, size), toClient = client.mr.asRemote().slice(size, size)
  const cbytes = client.mr.bytes, sbytes = server.mr.bytes
  cbytes[size + last] = 0; sbytes[size + last] = 0
  const warmup = o.warmup ?? Math.min(Math.floor(o.iters / 10), 1000)
  const samples = new Float64Array(o.iters)
  for (let i = 0; i < warmup + o.iters; i++) {
    const seq = (i % 255) + 1
    const t0 = performance.now()
    cbytes[last] = seq
    const a = client.qp.write(cl, toServer)
    spinFor(sbytes, size + last, seq)
    sbytes[last] = seq
    const b = server.qp.write(sl, toClient)
    await a
    spinFor(cbytes, size + last, seq)
    await b
    const t1 = performance.now()
    if (i >= warmup) samples[i - warmup] = ((t1 - t0) * 1000) / 2
    if (o.progress && (i & 255) === 0) o.progress(i / (warmup + o.iters))
  }
  return latencyResult(o, samples)
}

/** ib_read_lat: one READ outstanding at a time; latency = its full time. */
async function readLatency(pair: Pair, o: BenchOptions): Promise<LatResult> {
  const { client, server } = pair
  const local = client.mr.slice(0, o.size)
  const remote = server.mr.asRemote().slice(0, o.size)
  const warmup = o.warmup ?? Math.min(Math.floor(o.iters / 10), 1000)
  const samples = new Float64Array(o.iters)
  for (let i = 0; i < warmup + o.iters; i++) {
    const t0 = performance.now()
    await client.qp.read(local, remote)
    const t1 = performance.now()
    if (i >= warmup) samples[i - warmup] = (t1 - t0) * 1000
    if (o.progress && (i & 255) === 0) o.progress(i / (warmup + o.iters))
  }
  return latencyResult(o, samples)
}

/** ib_send_lat: SEND/RECV ping-pong; latency = RTT / 2. */
async function sendLatency(pair: Pair, o: BenchOptions): Promise<LatResult> {
  const { client, server } = pair
  const size = o.size
  const cs = client.mr.slice(0, size), ss = server.mr.slice(0, size)
  const warmup = o.warmup ?? Math.min(Math.floor(o.iters / 10), 1000)
  const samples = new Float64Array(o.iters)
  let serverRecv = server.qp.recv(ss)
  let clientRecv = client.qp.recv(cs)
  for (let i = 0; i < warmup + o.iters; i++) {
    const t0 = performance.now()
    const sent = client.qp.send(cs)
    await serverRecv
    serverRecv = server.qp.recv(ss)
    const back = server.qp.send(ss)
    await clientRecv
    clientRecv = client.qp.recv(cs)
    const t1 = performance.now()
    await sent
    await back
    if (i >= warmup) samples[i - warmup] = ((t1 - t0) * 1000) / 2
    if (o.progress && (i & 255) === 0) o.progress(i / (warmup + o.iters))
  }
  // Leave no receive outstanding (closing the device flushes them): swallow their rejection.
  serverRecv.catch(() => {})
  clientRecv.catch(() => {})
  return latencyResult(o, samples)
}
