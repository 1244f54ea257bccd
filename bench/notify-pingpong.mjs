#!/usr/bin/env node
// Notified writes timed the way ib_write_lat times its writes: two processes
// in ping-pong. The initiator writes `blocks` blocks with a notification; the
// echo, finding the data in place, writes its blocks back with a
// notification; the initiator's handler starts the next round. One way =
// half the round trip, as perftest reports. Each side checks that the last
// byte of the blocks it was sent holds the round's number before it answers
// (the data was in place when the notification ran).
//
//   bash scripts/softroce.sh run -- node bench/notify-pingpong.mjs --size 4096 --blocks 1 --poll busy
//   bash scripts/softroce.sh run -- node bench/notify-pingpong.mjs --compare --rounds 3
//   npm run bench -- notify [--rounds 3]     (the same table; boots the guest when needed)
//
// --layer engine (default): one TransferAgent per process (--qps N data QPs per peer, 1 by
//   default as the one-process rows of bench/transfer.mjs), write(peer, blocks, { notify }).
// --layer plan: the same agents, the blocks prepared once (agent.prepare()) and
//   each round a plan.run({ notify }): a fixed layout (a KV cache's) checked once.
// --layer verbs: one RC QP per process posting what the engine posts for it
//   (each block a WRITE, then a SEND_WITH_IMM of 8 bytes) by one postBatch(),
//   the peer's recv() resolving: Node's floor under the engine, same shape.
//
// Options: --size BYTES (4096, all blocks together), --blocks N (1), --iters N (1000),
//   --warm-s N (30: untimed rounds first), --poll event|busy (event), --layer engine|plan|verbs,
//   --dist DIR (another build of the library, for both processes),
//   --json (one line of JSON).
// --compare: per round, for 1 x 4 KiB and 16 x 4 KiB with event and busy CQs,
//   ib_write_lat of the same bytes, then the three layers; prints a Markdown table of
//   the medians over --rounds N (3) with the engine / ib_write_lat ratio's spread.
// Warm-up: V8 compiles the hot paths of both processes on the guest's two
// vCPUs while the rounds run; in the emulated guest that goes on for well over
// 5 s (counted: ~1M user instructions a round trip after 5 s, ~150k after 30 s).
import { fork, spawn } from 'node:child_process'
import { performance } from 'node:perf_hooks'
import { dirname, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { hasDevice } from './entry.mjs'
import { notifiedBatch, quantile } from './notify-floor.mjs'

const self = fileURLToPath(import.meta.url)

function parseArgs(argv) {
  const o = { size: 4096, blocks: 1, iters: 1000, warmS: 30, poll: 'event', layer: 'engine', qps: 1, json: false, echo: false, compare: false, rounds: 3, dist: undefined }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => argv[++i]
    switch (a) {
      case '--size': o.size = Number(val()); break
      case '--blocks': o.blocks = Number(val()); break
      case '--iters': o.iters = Number(val()); break
      case '--warm-s': o.warmS = Number(val()); break
      case '--poll': o.poll = val(); break
      case '--layer': o.layer = val(); break
      case '--qps': o.qps = Number(val()); break
      case '--json': o.json = true; break
      case '--compare': o.compare = true; break
      case '--rounds': o.rounds = Number(val()); break
      case '--dist': o.dist = val(); break
      case '--echo': o.echo = true; break
      default: throw new Error(`notify-pingpong: unknown option ${a}`)
    }
  }
  if (!(o.blocks >= 1) || !(o.size >= o.blocks) || !(o.iters >= 1) || !(o.warmS >= 0)) throw new Error('notify-pingpong: --size must be at least --blocks, both and --iters positive, --warm-s not negative')
  if (o.poll !== 'event' && o.poll !== 'busy') throw new Error('notify-pingpong: --poll is event or busy')
  if (!(o.qps >= 1)) throw new Error('notify-pingpong: --qps is a positive number')
  if (!['engine', 'plan', 'verbs'].includes(o.layer)) throw new Error('notify-pingpong: --layer is engine, plan or verbs')
  return o
}

/** Both sides' memory: blocks sent from [0, span), blocks received at [span, 2 span); a gap after each block (none coalesces). */
function layout(size, blocks) {
  const blockSize = Math.floor(size / blocks)
  const span = 2 * blocks * blockSize
  const at = (base, i) => base + 2 * i * blockSize
  return { blockSize, span, lastOut: at(0, blocks - 1) + blockSize - 1, lastIn: at(span, blocks - 1) + blockSize - 1, at }
}

/** The library: this checkout's build, or another (`--dist DIR`, a directory holding index.js). */
const library = (o) => import(o.dist ? pathToFileURL(resolve(o.dist, 'index.js')).href : '../dist/index.js')

const deviceName = () => process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE

/**
 * One process's end of the ping-pong. `hello`: what the peer needs (sent over
 * IPC); `start(peerHello)`: connects; `write(round)`: this side's notified
 * write of its blocks (resolves when it completed); `onArrival(cb)`: cb(round)
 * when the peer's notified write arrived; `bytes`: the memory both use.
 */
async function engineSide(o, name) {
  const { TransferAgent } = await library(o)
  const device = deviceName()
  const host = process.env.SOFTROCE_ADDR ?? '127.0.0.1'
  const agent = await TransferAgent.create({ host, port: 0, name, pollMode: o.poll, qpsPerPeer: o.qps, handshakeTimeoutMs: 60_000, ...(device ? { device } : {}) })
  const { blockSize, span, at } = layout(o.size, o.blocks)
  const buf = agent.register('buf', { size: 2 * span, remote: 'read-write' })
  const blocks = Array.from({ length: o.blocks }, (_, i) => ({ local: [buf, at(0, i)], remote: ['buf', at(span, i)], length: blockSize }))
  let peer
  let plan
  agent.on('notification', (n) => { peer ??= n.peer })
  return {
    hello: { port: agent.port },
    bytes: buf.bytes,
    async start(peerHello) { if (name === 'initiator') peer = await agent.connect({ host, port: peerHello.port, timeoutMs: 60_000 }) },
    // --layer plan: the blocks checked once (agent.prepare()), each round a run() of the plan.
    write: o.layer === 'plan'
      ? (round) => (plan ??= agent.prepare(peer, 'write', blocks)).run({ notify: String(round), timeoutMs: 60_000 })
      : (round) => agent.write(peer, blocks, { notify: String(round), timeoutMs: 60_000 }),
    onArrival(cb) { agent.on('notification', ({ message }) => cb(Number(message))) },
    close() { agent.close() },
  }
}

async function verbsSide(o) {
  const { openDevice, remoteRegion, Access } = await library(o)
  const device = openDevice(deviceName())
  const pd = device.allocPd()
  const cq = device.createCq({ entries: 1024, pollMode: o.poll })
  const qp = pd.createQp({ type: 'RC', sendCq: cq, recvCq: cq, maxSendWr: 128, maxRecvWr: 128 })
  const { blockSize, span } = layout(o.size, o.blocks)
  const mr = pd.allocRegion(2 * span + 128, Access.LocalWrite | Access.RemoteWrite)
  const inbox = mr.slice(2 * span + 64, 64)
  let batch
  let arrival = () => {}
  return {
    hello: { endpoint: qp.endpoint(), region: mr.describe() },
    bytes: mr.bytes,
    async start(peerHello) {
      const remote = remoteRegion(peerHello.region)
      batch = notifiedBatch(mr, remote, 0, span, o.blocks, blockSize, 2 * span)
      await qp.connect(peerHello.endpoint)
      let received = qp.recv(inbox) // posted before the peer can send
      const loop = async () => {
        for (;;) {
          let wc
          try { wc = await received } catch { return } // the QP closed
          received = qp.recv(inbox) // before answering: the peer's next send finds it
          arrival(wc.immediate)
        }
      }
      loop()
    },
    write(round) { batch[batch.length - 1].immediate = round >>> 0; return qp.postBatch(batch) },
    onArrival(cb) { arrival = cb },
    close() { device.close() },
  }
}

const openSide = (o, name) => (o.layer === 'verbs' ? verbsSide(o) : engineSide(o, name))

/** The child: answers each arrival with its own notified write, after checking the data. */
async function echo(o) {
  const side = await openSide(o, 'echo')
  const { lastOut, lastIn } = layout(o.size, o.blocks)
  const resolvedAfter = []
  const fail = (error) => { process.send({ error: String(error?.stack ?? error) }); side.close() }
  side.onArrival((round) => {
    const seq = round % 255 + 1
    if (side.bytes[lastIn] !== seq) return fail(new Error(`echo: round ${round} arrived before its data`))
    side.bytes[lastOut] = seq
    const t0 = performance.now()
    side.write(round).then(() => { resolvedAfter.push((performance.now() - t0) * 1000) }, fail)
  })
  process.on('message', async (m) => {
    if (m.hello) {
      try {
        await side.start(m.hello)
        process.send({ ready: true })
      } catch (error) { fail(error) }
    } else if (m === 'close') {
      resolvedAfter.sort((a, b) => a - b)
      console.error(`echo: its writes resolved after ${resolvedAfter[resolvedAfter.length >> 1]?.toFixed(1)} µs typical (${resolvedAfter.length})`)
      side.close()
      process.disconnect()
    }
  })
  process.send({ hello: side.hello })
}

/**
 * The echo process and this side, connected: `round(i)` runs round trip `i`
 * (this side's notified write, the echo's answer, both checked) and returns
 * its one way and when this side's write resolved (µs); `close()` ends both.
 * `dist`: another build of the library (bench/icount/node-paths.mjs counts
 * variants), for both processes.
 */
export async function pingPongPair(options) {
  const o = { ...parseArgs([]), ...options }
  const args = ['--echo', '--size', String(o.size), '--blocks', String(o.blocks), '--poll', o.poll, '--layer', o.layer, '--qps', String(o.qps), ...(o.dist ? ['--dist', o.dist] : [])]
  const child = fork(self, args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  let side
  const close = async () => {
    side?.close()
    if (child.connected) child.send('close')
    await new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', resolve)))
  }
  try {
    const fromChild = (key) => new Promise((resolve) => child.on('message', (m) => { if (m[key]) resolve(m[key]) }))
    const childFailed = new Promise((_, reject) => {
      child.on('message', (m) => { if (m.error) reject(new Error(m.error)) })
      child.on('exit', (code, signal) => reject(new Error(`notify-pingpong: the echo process exited (${signal ?? code})`)))
    })
    childFailed.catch(() => undefined)
    const ready = fromChild('ready')
    const peerHello = await Promise.race([childFailed, fromChild('hello')])
    side = await openSide(o, 'initiator')
    child.send({ hello: side.hello })
    await side.start(peerHello)
    await Promise.race([childFailed, ready])
    const { lastOut, lastIn } = layout(o.size, o.blocks)
    let answered
    side.onArrival((round) => answered?.(round))
    const round = async (i) => {
      const seq = i % 255 + 1
      side.bytes[lastOut] = seq
      const back = new Promise((resolve) => { answered = resolve })
      const t0 = performance.now()
      let tw = 0
      const written = side.write(i).then(() => { tw = performance.now() })
      const answer = await Promise.race([back, childFailed])
      const t1 = performance.now()
      await written
      if (answer !== i) throw new Error(`notify-pingpong: answer ${answer}, expected ${i}`)
      if (side.bytes[lastIn] !== seq) throw new Error(`notify-pingpong: answer ${i} came before its data`)
      return { oneWay: ((t1 - t0) * 1000) / 2, resolved: (tw - t0) * 1000 }
    }
    return { round, close }
  } catch (error) {
    await close()
    throw error
  }
}

/** Runs the ping-pong; returns one-way latencies (µs): half the round trip's median and p99. */
export async function notifyPingPong(options) {
  const o = { ...parseArgs([]), ...options }
  const pair = await pingPongPair(o)
  try {
    const oneWay = new Float64Array(o.iters)
    const resolvedAt = new Float64Array(o.iters) // µs from the call until this side's write resolved
    const warmStart = performance.now()
    const warmEnd = warmStart + o.warmS * 1000
    let warmup = 0
    let warmMs = 0
    for (let i = 0; i < warmup + o.iters; i++) {
      if (i === warmup && performance.now() < warmEnd) warmup++ // still warming up: this round is untimed
      else if (i === warmup) warmMs = performance.now() - warmStart
      const t = await pair.round(i)
      if (i >= warmup) {
        resolvedAt[i - warmup] = t.resolved
        oneWay[i - warmup] = t.oneWay
      }
    }
    oneWay.sort()
    resolvedAt.sort()
    return { kind: 'notify-pingpong', layer: o.layer, size: o.size, blocks: o.blocks, iters: o.iters, warmupRounds: warmup, warmupS: warmMs / 1000, pollMode: o.poll,
      oneWayTypical: quantile(oneWay, 0.5), oneWayP99: quantile(oneWay, 0.99), resolvedTypical: quantile(resolvedAt, 0.5), resolvedP99: quantile(resolvedAt, 0.99) }
  } finally {
    await pair.close()
  }
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n === 0 ? NaN : n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2 }
const fmt = (v) => (v === undefined || Number.isNaN(v) ? '–' : v >= 100 ? v.toFixed(0) : v.toFixed(1))

/** ib_write_lat against both layers' ping-pong, same bytes, interleaved per round; a Markdown table of the medians. */
async function compare(o) {
  const { perftest, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const device = deviceName()
  if (!device) throw new Error('notify-pingpong --compare: name the device in SOFTROCE_DEVICE or NODE_IBVERBS_DEVICE (scripts/softroce.sh run sets it)')
  const addr = process.env.SOFTROCE_ADDR ?? '127.0.0.1'
  const gidIndex = roceV2Ipv4GidIndex(device)
  const cases = []
  for (const [blocks, size] of [[1, 4096], [16, 65536]]) for (const poll of ['event', 'busy']) cases.push({ blocks, size, poll, perftest: [], engine: [], plan: [], verbs: [] })
  for (let round = 1; round <= o.rounds; round++) {
    for (const c of cases) {
      let pt
      for (let attempt = 0; attempt < 3 && !Number.isFinite(pt?.tTypical); attempt++) { // a run now and then reports no row
        pt = await perftest({ test: 'write_lat', size: c.size, iters: o.iters, txDepth: 128, device, gidIndex, addr }).catch((e) => { console.error(String(e.message).split('\n')[0]); return undefined })
      }
      if (!Number.isFinite(pt?.tTypical)) throw new Error(`notify-pingpong --compare: ib_write_lat of ${c.size} B gave no result`)
      c.perftest.push(pt)
      for (const layer of ['engine', 'plan', 'verbs']) c[layer].push(await notifyPingPong({ ...o, compare: false, layer, blocks: c.blocks, size: c.size, poll: c.poll }))
      const [e, p, v] = [c.engine.at(-1), c.plan.at(-1), c.verbs.at(-1)]
      console.error(`[r${round}] ${c.blocks} x ${c.size / c.blocks / 1024} KiB, ${c.poll}: ib_write_lat ${fmt(pt.tTypical)} µs, verbs layer ${fmt(v.oneWayTypical)}, engine ${fmt(e.oneWayTypical)} (${(e.oneWayTypical / pt.tTypical).toFixed(2)}x), prepared plan ${fmt(p.oneWayTypical)} (${(p.oneWayTypical / pt.tTypical).toFixed(2)}x)`)
    }
  }
  const lines = [
    `Two processes in ping-pong (engine: ${o.qps} QP${o.qps > 1 ? 's' : ''} per peer), one way (µs, median over ${o.rounds} rounds of each run's median / p99; ${o.iters} timed round trips after ${o.warmS} s of untimed ones). Ratio = engine / ib_write_lat per round: median [min–max].`,
    '',
    '| notified write | CQs | `ib_write_lat` typ / p99 | verbs layer typ / p99 (/ `ib_write_lat`) | engine write() typ / p99 | write() / `ib_write_lat` | prepared plan run() typ / p99 | run() / `ib_write_lat` |',
    '|---|---|---:|---:|---:|---|---:|---|',
  ]
  for (const c of cases) {
    const [pt, v] = [median(c.perftest.map((p) => p.tTypical)), median(c.verbs.map((r) => r.oneWayTypical))]
    // Typical / p99, then the ratio to ib_write_lat per round: median [min–max].
    const layer = (runs) => {
      const ratios = runs.map((r, i) => r.oneWayTypical / c.perftest[i].tTypical)
      return `${fmt(median(runs.map((r) => r.oneWayTypical)))} / ${fmt(median(runs.map((r) => r.oneWayP99)))} | ${median(ratios).toFixed(2)} [${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}]`
    }
    lines.push(`| ${c.blocks} x 4 KiB | ${c.poll} | ${fmt(pt)} / ${fmt(median(c.perftest.map((p) => p.p99)))} | ${fmt(v)} / ${fmt(median(c.verbs.map((r) => r.oneWayP99)))} (${(v / pt).toFixed(2)}) | ${layer(c.engine)} | ${layer(c.plan)} |`)
  }
  console.log(lines.join('\n'))
}

/**
 * `npm run bench -- notify [OPTIONS]`: the --compare table (options as above),
 * run in the Soft-RoCE guest when this machine has no RDMA device.
 */
export async function main(argv) {
  const args = argv.includes('--compare') ? argv : ['--compare', ...argv]
  parseArgs(args) // a bad option fails here, before a guest boots
  if (process.env.SOFTROCE_MODE || (await hasDevice())) return compare(parseArgs(args))
  console.error('notify bench: no RDMA device here; running in the Soft-RoCE environment (bash scripts/softroce.sh run -- ...)')
  const root = resolve(dirname(self), '..')
  const child = spawn('bash', [resolve(root, 'scripts', 'softroce.sh'), 'run', '--timeout', '5400', '--', process.execPath, self, ...args], { cwd: root, stdio: 'inherit' })
  process.exitCode = await new Promise((done) => child.on('close', (code) => done(code ?? 1)))
}

if (process.argv[1] === self) {
  const o = parseArgs(process.argv.slice(2))
  if (o.echo) {
    await echo(o)
  } else if (o.compare) {
    await compare(o)
  } else {
    const r = await notifyPingPong(o)
    const what = o.layer === 'verbs' ? 'WRITE + SEND_WITH_IMM by postBatch (verbs layer)' : 'notified write (engine)'
    if (o.json) console.log(JSON.stringify(r))
    else console.log(`${o.blocks} x ${o.size / o.blocks} B ${what}, ${o.poll} CQs, ping-pong in two processes: one way typical ${r.oneWayTypical.toFixed(1)} µs, p99 ${r.oneWayP99.toFixed(1)} µs; this side's write resolved after ${r.resolvedTypical.toFixed(1)} µs typical (${o.iters} iterations after ${r.warmupRounds} in ${r.warmupS.toFixed(1)} s of warm-up)`)
  }
}
