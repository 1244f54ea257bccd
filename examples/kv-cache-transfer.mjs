#!/usr/bin/env node
// Disaggregated LLM serving on the transfer engine: a prefill server hands a
// request's KV cache (many non-contiguous blocks) to a decode server. Two
// processes, each a TransferAgent:
//   decode:  owns a pool of KV blocks; for each request it picks free slots
//            and sends their table to the prefill side; it checks every block.
//   prefill: computes the request's blocks into random slots of its cache, then
//     --mode push: WRITEs them into the decode slots, with a notification that
//                  reaches the decode side after the data (NIXL/Mooncake "push");
//     --mode pull: tells the decode side where they are; the decode side READs
//                  them into its slots (vLLM's NIXL connector pulls).
// Block tables and acknowledgements travel as notifications (ordered, <= 1 KiB
// each, so a long table goes in parts). No CPU copies a KV byte.
//
//   one machine:   node examples/kv-cache-transfer.mjs [--mode push|pull] [--blocks 48] [--requests 4]
//                  (starts the decode side as a child process; default address
//                  $SOFTROCE_ADDR, else the device's RoCE v2 IPv4 address)
//   two machines:  decode:  node examples/kv-cache-transfer.mjs --role decode --host ADDR [--port 7480]
//                  prefill: node examples/kv-cache-transfer.mjs --role prefill --host ADDR --peer DECODE_ADDR [--port 7480]
//   (the two-host Soft-RoCE topology: ADDR=$SOFTROCE_ADDR, DECODE_ADDR=$SOFTROCE_PEER_ADDR)
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { exampleArgs, localAddress } from './cli-args.mjs'
import { TransferAgent } from 'node-ibverbs'

const usage = `usage: kv-cache-transfer.mjs [--mode push|pull] [--role both|decode|prefill] [--host ADDR] [--peer ADDR]
       [--port 7480] [--blocks 48] [--block-kib 64] [--requests 4] [--qps 2] [--timeout-ms 60000] [--device NAME]`
const { values: v, int } = exampleArgs(usage, {
  mode: { type: 'string', default: 'push' },
  role: { type: 'string', default: 'both' },
  host: { type: 'string' },
  peer: { type: 'string' },
  port: { type: 'string', default: '7480' },
  blocks: { type: 'string', default: '48' },
  'block-kib': { type: 'string', default: '64' },
  requests: { type: 'string', default: '4' },
  qps: { type: 'string', default: '2' },
  'timeout-ms': { type: 'string', default: '60000' },
  device: { type: 'string' },
})
if (!['push', 'pull'].includes(v.mode) || !['both', 'decode', 'prefill'].includes(v.role)) {
  console.error(`--mode is push or pull, --role is both, decode or prefill\n${usage}`)
  process.exit(2)
}
const MODE = v.mode
const BLOCKS = int('blocks', 1, 1 << 20) // blocks per request
const BLOCK = int('block-kib', 1, 1 << 16) * 1024
const REQUESTS = int('requests', 1, 1 << 20)
const QPS = int('qps', 1, 16)
const TIMEOUT = int('timeout-ms', 1, 2 ** 31 - 1)
const SLOTS = 2 * BLOCKS // each side's pool holds two requests' worth of blocks
const device = v.device ?? process.env.NODE_IBVERBS_DEVICE ?? process.env.SOFTROCE_DEVICE

// Deterministic contents for block b of request r, so the decode side can check it.
function fill(bytes, request, block) {
  let x = (request * 7919 + block * 104729 + 1) >>> 0
  for (let i = 0; i < bytes.length; i += 4) {
    x = (x * 1664525 + 1013904223) >>> 0
    bytes[i] = x; bytes[i + 1] = x >>> 8; bytes[i + 2] = x >>> 16; bytes[i + 3] = x >>> 24
  }
}

/** `count` distinct random slots out of `n`, as byte offsets. */
function pickSlots(n, count) {
  const all = [...Array(n).keys()]
  for (let i = 0; i < count; i++) {
    const j = i + Math.floor(Math.random() * (n - i))
    ;[all[i], all[j]] = [all[j], all[i]]
  }
  return Float64Array.from(all.slice(0, count), (slot) => slot * BLOCK)
}

// --- block tables over notifications (ordered per peer, up to 1 KiB each) ----
const PART = 100 // offsets per notification

async function sendTable(agent, peer, type, request, offsets) {
  for (let at = 0; at < offsets.length; at += PART) {
    const part = Array.from(offsets.subarray(at, at + PART), (o) => o / BLOCK)
    await agent.notify(peer, JSON.stringify({ type, request, slots: part, last: at + PART >= offsets.length }), { timeoutMs: TIMEOUT })
  }
}

/** The next notification of `type` for `request` (they arrive in order). */
async function expect(inbox, type, request) {
  const { value, done } = await inbox.next()
  if (done) throw new Error(`the agent closed while waiting for '${type}' of request ${request}`)
  const message = JSON.parse(String(value.message))
  if (message.type !== type || message.request !== request) throw new Error(`expected '${type}' of request ${request}, got ${JSON.stringify(message).slice(0, 80)}`)
  return message
}

async function receiveTable(inbox, type, request) {
  const slots = []
  for (;;) {
    const part = await expect(inbox, type, request)
    slots.push(...part.slots)
    if (part.last) return Float64Array.from(slots, (slot) => slot * BLOCK)
  }
}

/** Rejects if `promise` takes longer than TIMEOUT: no wait in this example is unbounded. */
function bounded(promise, what) {
  let timer
  const timeout = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`no ${what} within ${TIMEOUT} ms`)), TIMEOUT) })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

// --- decode server: a pool of KV blocks, filled remotely --------------------
async function decode(port) {
  const agent = await TransferAgent.create({ host: localAddress(v.host, device), port, name: 'decode', ...(device ? { device } : {}) })
  // push: the prefill side writes into the pool; pull: only this side touches it.
  const pool = agent.register('kv-pool', { size: SLOTS * BLOCK, remote: MODE === 'push' ? 'write' : 'none' })
  const inbox = agent.notifications()
  const arrived = once(agent, 'peer')
  console.log(`decode: listening on ${agent.host}:${agent.port} (${MODE})`)
  const [peer] = await bounded(arrived, 'prefill connection')
  const expected = new Uint8Array(BLOCK)
  let checked = 0
  for (let r = 0; r < REQUESTS; r++) {
    const slots = pickSlots(SLOTS, BLOCKS)
    await sendTable(agent, peer, 'slots', r, slots)
    if (MODE === 'push') {
      // The notification comes after every block is in place.
      await bounded(expect(inbox, 'written', r), `blocks of request ${r}`)
    } else {
      const from = await bounded(receiveTable(inbox, 'ready', r), `table of request ${r}`)
      await agent.read(peer, { local: pool, remote: 'kv-cache', localOffsets: slots, remoteOffsets: from, blockSize: BLOCK }, { timeoutMs: TIMEOUT })
    }
    for (let b = 0; b < BLOCKS; b++) {
      fill(expected, r, b)
      if (Buffer.compare(pool.bytes.subarray(slots[b], slots[b] + BLOCK), expected) !== 0) throw new Error(`request ${r}: block ${b} in slot ${slots[b] / BLOCK} is wrong`)
      checked++
    }
    await agent.notify(peer, JSON.stringify({ type: 'checked', request: r }), { timeoutMs: TIMEOUT })
  }
  const { total } = agent.stats()
  console.log(`decode side verified ${checked} blocks (${((checked * BLOCK) / 2 ** 20).toFixed(1)} MiB, ${MODE}); ` +
    `${total.bytes} bytes read by this side, ${total.notificationsReceived} notifications received`)
  // The prefill side closes first (it has the last word): leaving earlier could cut off its last notification.
  await bounded(once(agent, 'peerLost'), 'prefill disconnect').catch(() => undefined)
  agent.close()
}

// --- prefill server: its KV cache, handed to the decode pool ----------------
async function prefill(peerHost, port) {
  const agent = await TransferAgent.create({ host: localAddress(v.host, device), port: 0, name: 'prefill', qpsPerPeer: QPS, ...(device ? { device } : {}) })
  const cache = agent.register('kv-cache', { size: SLOTS * BLOCK, remote: MODE === 'pull' ? 'read' : 'none' })
  const inbox = agent.notifications()
  let peer
  for (const deadline = Date.now() + TIMEOUT; !peer;) {
    try {
      peer = await agent.connect({ host: peerHost, port, timeoutMs: TIMEOUT })
    } catch (error) {
      // The decode side may not listen yet (another machine still booting).
      if (!['ECONNREFUSED', 'ETIMEDOUT', 'EHOSTUNREACH'].includes(error.code) || Date.now() > deadline) throw error
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
  let bytes = 0
  let transferMs = 0
  for (let r = 0; r < REQUESTS; r++) {
    const slots = await bounded(receiveTable(inbox, 'slots', r), `slots of request ${r}`)
    const mine = pickSlots(SLOTS, BLOCKS) // where this request's KV happens to live here
    for (let b = 0; b < BLOCKS; b++) fill(cache.bytes.subarray(mine[b], mine[b] + BLOCK), r, b)
    const t0 = performance.now()
    if (MODE === 'push') {
      const done = await agent.write(peer, { local: cache, remote: 'kv-pool', localOffsets: mine, remoteOffsets: slots, blockSize: BLOCK },
        { notify: JSON.stringify({ type: 'written', request: r }), timeoutMs: TIMEOUT })
      console.log(`request ${r}: ${done.blocks} blocks of ${BLOCK / 1024} KiB written as ${done.workRequests} work requests over ${done.qps} QPs`)
    } else {
      await sendTable(agent, peer, 'ready', r, mine)
    }
    await bounded(expect(inbox, 'checked', r), `decode check of request ${r}`)
    transferMs += performance.now() - t0
    bytes += BLOCKS * BLOCK
    if (MODE === 'pull') console.log(`request ${r}: ${BLOCKS} blocks of ${BLOCK / 1024} KiB read by the decode side`)
  }
  console.log(`prefill: ${REQUESTS} requests, ${(bytes / 2 ** 20).toFixed(1)} MiB handed over (${MODE}) in ${(transferMs / 1000).toFixed(2)} s: ` +
    `${(bytes / 2 ** 20 / (transferMs / 1000)).toFixed(1)} MiB/s, including the decode side's checks`)
  agent.close()
}

// --- both roles on one machine: the decode side in a child process ------------
async function both() {
  const self = fileURLToPath(import.meta.url)
  const args = process.argv.slice(2).filter((a, i, all) => a !== '--role' && all[i - 1] !== '--role' && !a.startsWith('--role='))
  const child = spawn(process.execPath, [self, ...args, '--role', 'decode', '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] })
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve(code ?? signal)))
  const lines = createInterface({ input: child.stdout })
  const listening = new Promise((resolve, reject) => {
    lines.on('line', (line) => {
      console.log(line)
      const m = /^decode: listening on (\S+):(\d+)/.exec(line)
      if (m) resolve([m[1], Number(m[2])])
    })
    exited.then((code) => reject(new Error(`the decode process exited (${code}) before listening`)))
  })
  const [host, port] = await bounded(listening, 'decode process')
  try {
    await prefill(host, port)
  } catch (error) {
    child.kill()
    throw error
  }
  const code = await bounded(exited, 'decode process exit')
  if (code !== 0) throw new Error(`the decode process failed (${code})`)
}

if (v.role === 'decode') await decode(int('port', 0, 65535))
else if (v.role === 'prefill') {
  if (!v.peer) { console.error(`--role prefill needs --peer ADDR\n${usage}`); process.exit(2) }
  await prefill(v.peer, int('port', 1, 65535))
} else await both()
