#!/usr/bin/env node
// Notified writes timed the way ib_write_lat times its writes: two processes,
// one agent each, in ping-pong. The initiator writes `blocks` blocks with a
// notification; the echo's handler, finding the data in place, writes its
// blocks back with a notification; the initiator's handler starts the next
// round. One way = half the round trip, as perftest reports. Each side checks
// that the last byte of the blocks it was sent holds the round's number before
// it answers (the data was in place when the notification ran).
//
//   bash scripts/softroce.sh run -- node bench/notify-pingpong.mjs --size 4096 --blocks 1 --poll busy
//
// Options: --size BYTES (4096, all blocks together), --blocks N (1), --iters N (1000),
//   --warm-s N (5: untimed rounds first; V8 optimizes over the first seconds), --poll event|busy (event),
//   --json (one line of JSON).
// bench/transfer.mjs runs it next to ib_write_lat for its latency cases.
import { fork } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const self = fileURLToPath(import.meta.url)

function parseArgs(argv) {
  const o = { size: 4096, blocks: 1, iters: 1000, warmS: 5, poll: 'event', json: false, echo: false }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => argv[++i]
    switch (a) {
      case '--size': o.size = Number(val()); break
      case '--blocks': o.blocks = Number(val()); break
      case '--iters': o.iters = Number(val()); break
      case '--warm-s': o.warmS = Number(val()); break
      case '--poll': o.poll = val(); break
      case '--json': o.json = true; break
      case '--echo': o.echo = true; break
      default: throw new Error(`notify-pingpong: unknown option ${a}`)
    }
  }
  if (!(o.blocks >= 1) || !(o.size >= o.blocks) || !(o.iters >= 1)) throw new Error('notify-pingpong: --size must be at least --blocks, both and --iters positive')
  if (o.poll !== 'event' && o.poll !== 'busy') throw new Error('notify-pingpong: --poll is event or busy')
  return o
}

/** Both sides' memory: blocks sent from [0, span), blocks received at [span, 2 span); a gap after each block (none coalesces). */
function layout(size, blocks) {
  const blockSize = Math.floor(size / blocks)
  const span = 2 * blocks * blockSize
  const at = (base, i) => base + 2 * i * blockSize
  return { blockSize, span, lastOut: at(0, blocks - 1) + blockSize - 1, lastIn: at(span, blocks - 1) + blockSize - 1, at }
}

async function openAgent(o, name) {
  const { TransferAgent } = await import('../dist/index.js')
  const device = process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE
  const host = process.env.SOFTROCE_ADDR ?? '127.0.0.1'
  const agent = await TransferAgent.create({ host, port: 0, name, pollMode: o.poll, handshakeTimeoutMs: 60_000, ...(device ? { device } : {}) })
  const { span } = layout(o.size, o.blocks)
  const buf = agent.register('buf', { size: 2 * span, remote: 'read-write' })
  return { agent, buf, host }
}

/** The write of this side's blocks into the peer's receive half. */
function blocksOf(o, buf) {
  const { blockSize, span, at } = layout(o.size, o.blocks)
  return Array.from({ length: o.blocks }, (_, i) => ({ local: [buf, at(0, i)], remote: ['buf', at(span, i)], length: blockSize }))
}

/** The child: answers each notification with its own notified write, after checking the data. */
async function echo(o) {
  const { agent, buf } = await openAgent(o, 'echo')
  const { lastOut, lastIn } = layout(o.size, o.blocks)
  const blocks = blocksOf(o, buf)
  const fail = (error) => { process.send({ error: String(error?.stack ?? error) }); agent.close() }
  agent.on('notification', ({ peer, message }) => {
    const seq = Number(message) % 255 + 1
    if (buf.bytes[lastIn] !== seq) return fail(new Error(`echo: notification ${message} came before its data`))
    buf.bytes[lastOut] = seq
    const t0 = performance.now()
    agent.write(peer, blocks, { notify: message }).then(() => { echoResolved.push((performance.now() - t0) * 1000) }, fail)
  })
  const echoResolved = []
  process.on('message', (m) => {
    if (m !== 'close') return
    echoResolved.sort((a, b) => a - b)
    console.error(`echo: its writes resolved after ${echoResolved[echoResolved.length >> 1]?.toFixed(1)} µs typical (${echoResolved.length})`)
    agent.close()
    process.disconnect()
  })
  process.send({ port: agent.port })
}

function quantile(sorted, q) { return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] }

/** Runs the ping-pong; returns one-way latencies (µs): half the round trip's median and p99. */
export async function notifyPingPong(options) {
  const o = { ...parseArgs([]), ...options }
  const child = fork(self, ['--echo', '--size', String(o.size), '--blocks', String(o.blocks), '--poll', o.poll], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  let side
  try {
    const childFailed = new Promise((_, reject) => {
      child.on('message', (m) => { if (m.error) reject(new Error(m.error)) })
      child.on('exit', (code, signal) => reject(new Error(`notify-pingpong: the echo process exited (${signal ?? code})`)))
    })
    childFailed.catch(() => undefined)
    const port = await Promise.race([childFailed, new Promise((resolve) => child.on('message', (m) => { if (m.port) resolve(m.port) }))])
    side = await openAgent(o, 'initiator')
    const { agent, buf, host } = side
    const peer = await agent.connect({ host, port, timeoutMs: 60_000 })
    const { lastOut, lastIn } = layout(o.size, o.blocks)
    const blocks = blocksOf(o, buf)
    let answered
    agent.on('notification', ({ message }) => answered?.(message))
    const oneWay = new Float64Array(o.iters)
    const resolvedAt = new Float64Array(o.iters) // µs from the call until this side's write resolved
    const warmEnd = performance.now() + o.warmS * 1000
    let warmup = 0
    for (let i = 0; i < warmup + o.iters; i++) {
      if (i === warmup && performance.now() < warmEnd) warmup++ // still warming up: this round is untimed
      const seq = i % 255 + 1
      buf.bytes[lastOut] = seq
      const back = new Promise((resolve) => { answered = resolve })
      const t0 = performance.now()
      let tw = 0
      const written = agent.write(peer, blocks, { notify: String(i), timeoutMs: 60_000 }).then(() => { tw = performance.now() })
      const message = await Promise.race([back, childFailed])
      const t1 = performance.now()
      await written
      if (i >= warmup) resolvedAt[i - warmup] = (tw - t0) * 1000
      if (message !== String(i)) throw new Error(`notify-pingpong: answer ${message}, expected ${i}`)
      if (buf.bytes[lastIn] !== seq) throw new Error(`notify-pingpong: answer ${i} came before its data`)
      if (i >= warmup) oneWay[i - warmup] = ((t1 - t0) * 1000) / 2
    }
    oneWay.sort()
    resolvedAt.sort()
    return { kind: 'notify-pingpong', size: o.size, blocks: o.blocks, iters: o.iters, warmupRounds: warmup, pollMode: o.poll, oneWayTypical: quantile(oneWay, 0.5), oneWayP99: quantile(oneWay, 0.99),
      resolvedTypical: quantile(resolvedAt, 0.5), resolvedP99: quantile(resolvedAt, 0.99) }
  } finally {
    side?.agent.close()
    if (child.connected) child.send('close')
    await new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', resolve)))
  }
}

if (process.argv[1] === self) {
  const o = parseArgs(process.argv.slice(2))
  if (o.echo) {
    await echo(o)
  } else {
    const r = await notifyPingPong(o)
    if (o.json) console.log(JSON.stringify(r))
    else console.log(`${o.blocks} x ${o.size / o.blocks} B notified write, ${o.poll} CQs, ping-pong in two processes: one way typical ${r.oneWayTypical.toFixed(1)} µs, p99 ${r.oneWayP99.toFixed(1)} µs; this side's write resolved after ${r.resolvedTypical.toFixed(1)} µs typical (${o.iters} iterations)`)
  }
}
