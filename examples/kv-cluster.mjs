#!/usr/bin/env node
// A small disaggregated-serving cluster on the transfer engine, found through
// etcd: 2 prefill and 2 decode agents, each in its own process, and a router.
// For each request the router picks a decode agent by name (from its etcd view
// of the cluster) and a prefill agent; the prefill agent connects to the decode
// agent by name and WRITEs the request's KV blocks (scattered slots on both
// sides) into it, with a notification that arrives after the data; the decode
// agent checks every block (a pattern seeded per request) and reports.
//
// Mid-run the router kills decode-1 (SIGKILL) and restarts it under the same
// name on the same port (a new incarnation). Requests in flight to the dead
// one fail with a coded error (printed), or are never confirmed and are
// dropped when the router sees that incarnation leave the cluster; either way
// they are re-routed to a live decode agent. It exits 0 only if every request
// was delivered once and verified.
//
//   one guest, one rxe device:
//     bash scripts/softroce.sh run -- node examples/kv-cluster.mjs
//   any machine with an RDMA device and Debian's etcd-server (`etcd` on PATH):
//     node examples/kv-cluster.mjs [--requests 48] [--window 4] [--block-kib 16] [--ttl 5]
//   each write and notification, on stderr: KV_CLUSTER_TRACE=1 node examples/kv-cluster.mjs
//   an etcd of your own (then scripts/etcd-server.mjs is not needed):
//     node examples/kv-cluster.mjs --etcd http://10.0.0.5:2379
//
//   two hosts (here 10.0.0.1 and 10.0.0.2, each with an RDMA device on that address):
//     host 0, the router, a private etcd on 10.0.0.1 and the prefill agents:
//       node examples/kv-cluster.mjs --listen 10.0.0.1:7493 --agents prefill-0,prefill-1 --host 10.0.0.1
//     host 1, a launcher that owns the decode agents:
//       node examples/kv-cluster.mjs --role launcher --router 10.0.0.1:7493 --agents decode-0,decode-1 --host 10.0.0.2
//     (test/two-host/62.kv-cluster.test.ts runs these two in two emulated guests, with --host from
//     $SOFTROCE_ADDR and --requests 32 --ttl 15 --request-timeout-ms 10000)
//     With --etcd URL instead of the private etcd, URL must be reachable from every host.
//
// Without --etcd the router starts a private etcd (scripts/etcd-server.mjs: free
// ports of 127.0.0.1, or of the --listen address, a temporary data dir, stopped
// at the end). The router talks to its agents over the child-process IPC
// channel: a stand-in for the serving framework's RPC. Only the KV bytes and
// their notifications travel over RDMA; names, addresses and liveness come
// from etcd.
//
// Across hosts: the router can only fork processes on its own host, so each
// other host runs a launcher (--role launcher) that connects to the router's
// --listen address over plain TCP and says which agents it owns (--agents).
// The router then drives those agents exactly as its own children: one JSON
// object per line, {start, send, kill} from the router (start carries the
// agent's arguments, the launcher adds its own --host and --device), {message,
// exit} back, the agents' IPC messages relayed unchanged. So the kill and the
// restart of decode-1 are done by the launcher that owns it (SIGKILL on its
// host, then the same name and port again), on the router's word. At the end
// the router stops every agent, sends the launchers its verdict and closes;
// a launcher exits 0 only if the verdict is ok, and stops its agents if the
// router goes away. The connection is neither authenticated nor encrypted:
// a trusted network only, like the RPC it stands in for. Agents listen on
// --host (else $SOFTROCE_ADDR, else their device's IPv4 address): it must be
// reachable from the other hosts, as it is what etcd publishes.
//
// Fencing: each decode agent registers its pool as segment `kv-<incarnation>`
// and the router names that segment in each request, so a write meant for an
// earlier incarnation can never land in a restarted agent's memory: it fails
// with ERR_SEGMENT_UNKNOWN (or ERR_STALE_PEER at the handshake) and is
// re-routed. See docs/cluster.md.
import { fork } from 'node:child_process'
import { once } from 'node:events'
import { connect, createServer } from 'node:net'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { exampleArgs, localAddress } from './cli-args.mjs'
import { TransferAgent } from 'node-ibverbs'

const usage = `usage: kv-cluster.mjs [--requests 48] [--window 4] [--block-kib 16] [--max-blocks 24] [--kill-after N] [--after-restart 8]
       [--ttl 5] [--request-timeout-ms 2000] [--max-attempts 8] [--timeout-ms 120000] [--etcd URL] [--host ADDR] [--device NAME]
       [--listen ADDR:PORT --agents NAMES]     (the router, with launchers on other hosts)
       kv-cluster.mjs --role launcher --router ADDR:PORT --agents NAMES [--host ADDR] [--device NAME] [--timeout-ms 120000]
       (internal: --role prefill|decode --name NAME --port N)`
const { values: v, int } = exampleArgs(usage, {
  role: { type: 'string', default: 'router' },
  name: { type: 'string' },
  port: { type: 'string', default: '0' },
  requests: { type: 'string', default: '48' },
  window: { type: 'string', default: '4' },
  'block-kib': { type: 'string', default: '16' },
  'max-blocks': { type: 'string', default: '24' },
  'kill-after': { type: 'string' },
  'after-restart': { type: 'string', default: '8' },
  ttl: { type: 'string', default: '5' },
  'request-timeout-ms': { type: 'string', default: '2000' },
  'max-attempts': { type: 'string', default: '8' },
  'timeout-ms': { type: 'string', default: '120000' },
  etcd: { type: 'string' },
  host: { type: 'string' },
  device: { type: 'string' },
  listen: { type: 'string' },
  router: { type: 'string' },
  agents: { type: 'string' },
})
const REQUESTS = int('requests', 1, 1 << 20)
const WINDOW = int('window', 1, 64) // requests in flight at once
const BLOCK = int('block-kib', 1, 1024) * 1024
const MAX_BLOCKS = int('max-blocks', 1, 64) // blocks per request: 1/3..1 of this, seeded
const TTL = int('ttl', 2, 3600)
const REQUEST_TIMEOUT = int('request-timeout-ms', 100, 60_000) // each etcd request's bound
const MAX_ATTEMPTS = int('max-attempts', 1, 100)
const TIMEOUT = int('timeout-ms', 1000, 2 ** 31 - 1)
// Every request in flight fits in any one agent's pool (the router may send them all to one).
const SLOTS = WINDOW * MAX_BLOCKS
const PREFIX = '/node-ibverbs/kv-cluster/'
const NAMES = ['decode-0', 'decode-1', 'prefill-0', 'prefill-1']
const device = v.device ?? process.env.NODE_IBVERBS_DEVICE ?? process.env.SOFTROCE_DEVICE
const self = fileURLToPath(import.meta.url)
const t0 = performance.now()
const TRACE = process.env.KV_CLUSTER_TRACE === '1'
const trace = (text) => { if (TRACE) console.error(`[${((performance.now() - t0) / 1000).toFixed(3)} s] ${v.name ?? 'router'}: ${text}`) }
const log = (text) => console.log(`[${((performance.now() - t0) / 1000).toFixed(1).padStart(5)} s] ${v.role}: ${text}`)

/** Deterministic contents of block `b` of the request seeded `seed` (whole 32-bit words): the decode side recomputes it. */
function fill(bytes, seed, b) {
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2)
  let x = (Math.imul(seed, 2654435761) + Math.imul(b, 40503) + 1) >>> 0
  for (let i = 0; i < words.length; i++) words[i] = x = (Math.imul(x, 1664525) + 1013904223) >>> 0
}

/** A small seeded generator (mulberry32), so a run is the same every time. */
function seeded(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** `count` slots taken at random from `free` (scattered blocks). */
function take(free, count, random) {
  const out = []
  for (let i = 0; i < count; i++) out.push(free.splice(Math.floor(random() * free.length), 1)[0])
  return out
}

function metadata(endpoint) {
  return { endpoints: [endpoint], ttlSeconds: TTL, prefix: PREFIX, requestTimeoutMs: REQUEST_TIMEOUT }
}

async function createAgent(name, endpoint, port = 0) {
  return TransferAgent.create({ host: localAddress(v.host, device), port, name, metadata: metadata(endpoint), ...(device ? { device } : {}) })
}

/** A child agent ends when the router says so, or when the router is gone (its IPC channel closed). */
function serveUntilStopped(agent, onStop = () => ({})) {
  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    const last = onStop()
    await agent.close() // revokes the lease: peers see it leave at once
    if (process.connected) process.send({ type: 'bye', ...last }, () => process.exit(0))
    else process.exit(0)
  }
  process.on('message', (m) => { if (m.type === 'stop') void stop() })
  process.on('disconnect', () => void stop())
}

// --- decode agent: a pool of KV slots, written remotely, every block checked --
async function decodeAgent(name, endpoint, port) {
  const agent = await createAgent(name, endpoint, port)
  // Named after the incarnation: a write meant for an earlier one finds no such segment here.
  const pool = agent.register(`kv-${agent.id}`, { size: SLOTS * BLOCK, remote: 'write' })
  const expected = new Uint8Array(BLOCK)
  let checked = 0
  agent.on('notification', ({ peer, message }) => {
    const m = JSON.parse(String(message))
    trace(`notice ${m.id}.${m.attempt} from ${peer.name} (${peer.stats().notificationsReceived} received from it)`)
    let bad = 0
    for (let b = 0; b < m.slots.length; b++) {
      fill(expected, m.seed, b)
      const at = m.slots[b] * BLOCK
      if (Buffer.compare(pool.bytes.subarray(at, at + BLOCK), expected) !== 0) bad++
    }
    checked++
    if (process.connected) process.send({ type: 'verified', id: m.id, attempt: m.attempt, name, incarnation: agent.id, from: peer.name,
      misdelivered: m.to !== name || m.incarnation !== agent.id, blocks: m.slots.length, bad })
  })
  serveUntilStopped(agent, () => ({ checked }))
  process.send({ type: 'ready', name, incarnation: agent.id, port: agent.port, pid: process.pid })
}

// --- prefill agent: computes a request's blocks and writes them to a decode agent
async function prefillAgent(name, endpoint) {
  const agent = await createAgent(name, endpoint)
  // Twice the window: a write the router gave up on (its decode agent left) may still hold its slots.
  const cache = agent.register('kv-cache', { size: 2 * SLOTS * BLOCK })
  const free = [...Array(2 * SLOTS).keys()]
  const random = seeded(name.length * 7919 + name.charCodeAt(name.length - 1))
  process.on('message', async (m) => {
    if (m.type !== 'write') return
    if (free.length < m.slots.length) return process.send({ type: 'failed', id: m.id, attempt: m.attempt, code: 'PREFILL_BUSY', message: 'no free cache slots' })
    // Where this request's KV happens to live here: scattered slots of the cache.
    const mine = take(free, m.slots.length, random)
    for (let b = 0; b < mine.length; b++) fill(cache.bytes.subarray(mine[b] * BLOCK, (mine[b] + 1) * BLOCK), m.seed, b)
    try {
      const peer = await agent.connect(m.decode, { timeoutMs: TIMEOUT }) // by name, through etcd
      const done = await agent.write(peer, {
        local: cache, remote: `kv-${m.incarnation}`, blockSize: BLOCK,
        localOffsets: Float64Array.from(mine, (s) => s * BLOCK), remoteOffsets: Float64Array.from(m.slots, (s) => s * BLOCK),
      }, { notify: JSON.stringify({ id: m.id, attempt: m.attempt, seed: m.seed, to: m.decode, incarnation: m.incarnation, slots: m.slots }), timeoutMs: TIMEOUT })
      trace(`wrote ${m.id}.${m.attempt} to ${peer.name} ${peer.id.slice(0, 8)}: ${done.blocks} blocks, ${done.workRequests} WRs over ${done.qps} QPs (${peer.stats().notificationsSent} notified)`)
      if (process.connected) process.send({ type: 'written', id: m.id, attempt: m.attempt, bytes: done.bytes })
    } catch (error) {
      trace(`write ${m.id}.${m.attempt} to ${m.decode} failed: ${error.code}`)
      if (process.connected) process.send({ type: 'failed', id: m.id, attempt: m.attempt, code: error.code ?? 'ERR_UNCODED', message: error.message })
    } finally {
      free.push(...mine) // the write settled: no work request reads these slots any more
    }
  })
  serveUntilStopped(agent)
  process.send({ type: 'ready', name, incarnation: agent.id, port: agent.port, pid: process.pid })
}

// --- where agents run: this host's children, or a launcher's on another host --
// Both give the router the same handle: send(message), kill(), exited (the exit code or signal).

/** Agents forked here, talking over the child-process IPC channel. */
const here = {
  where: 'this host',
  start(name, args, onMessage) {
    const child = fork(self, [...args, ...(v.host ? ['--host', v.host] : []), ...(device ? ['--device', device] : [])], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
    child.on('message', onMessage)
    return {
      send: (m) => { if (child.connected) child.send(m) },
      kill: () => child.kill('SIGKILL'),
      exited: new Promise((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal))),
    }
  },
}

/** One JSON object per line over a TCP socket: returns send(object); `onMessage` gets each object received. */
function jsonLines(socket, onMessage) {
  createInterface({ input: socket, crlfDelay: Infinity }).on('line', (line) => {
    if (!line) return
    let m
    try { m = JSON.parse(line) } catch { return void socket.destroy(new Error(`not JSON: ${line.slice(0, 80)}`)) }
    onMessage(m)
  })
  return (m) => { if (!socket.destroyed && socket.writable) socket.write(`${JSON.stringify(m)}\n`) }
}

/** `ADDR:PORT` (an IPv6 address in brackets) as [host, port]. */
function hostPort(text, option) {
  const at = text.lastIndexOf(':')
  const port = Number(text.slice(at + 1))
  if (at < 1 || !Number.isInteger(port) || port < 1 || port > 65535) { console.error(`--${option} is ADDR:PORT, got ${text}\n${usage}`); process.exit(2) }
  return [text.slice(0, at).replace(/^\[(.*)\]$/, '$1'), port]
}

/** `--agents`: names out of NAMES, each once. */
function agentNames(fallback) {
  const names = v.agents === undefined ? fallback : v.agents.split(',').filter(Boolean)
  const bad = names.filter((n, i) => !NAMES.includes(n) || names.indexOf(n) !== i)
  if (bad.length) { console.error(`--agents takes names out of ${NAMES.join(',')}, each once; got ${v.agents}\n${usage}`); process.exit(2) }
  return names
}

/**
 * The router's end of a launcher's connection: it starts, kills and stops the launcher's agents on the
 * router's word and relays their messages ({type: 'start'|'send'|'kill'|'end'} one way, {type: 'message'|'exit'} back).
 */
function remote(socket, send, host) {
  const agents = new Map() // name -> { onMessage, exit } of the agent started last under that name
  let gone = false
  let ending = false
  const where = `the launcher at ${host}`
  const receive = (m) => {
    const agent = agents.get(m.name)
    if (m.type === 'message') agent?.onMessage(m.message)
    else if (m.type === 'exit') agent?.exit(m.code)
  }
  socket.on('close', () => {
    gone = true
    if (!ending) log(`${where}: its connection closed (its agents are taken as exited)`)
    for (const agent of agents.values()) agent.exit('its launcher is gone')
  })
  return {
    where,
    receive,
    /** Sends the last word and ends the connection; resolves when it is closed (bounded). */
    end: (m) => {
      ending = true
      send(m)
      socket.end()
      return Promise.race([once(socket, 'close'), new Promise((resolve) => setTimeout(resolve, 5000))])
    },
    start(name, args, onMessage) {
      let exit
      const exited = new Promise((resolve) => { exit = resolve })
      agents.set(name, { onMessage, exit })
      if (gone) exit('its launcher is gone')
      else send({ type: 'start', name, args })
      return { send: (message) => send({ type: 'send', name, message }), kill: () => send({ type: 'kill', name }), exited }
    },
  }
}

/**
 * Waits until launchers (other hosts) have claimed every name in `wanted`: each connects to --listen and says
 * {type: 'hello', agents, host}. Resolves with the server and a map name -> the remote() that owns it.
 */
async function acceptLaunchers(listen, wanted) {
  const [host, port] = hostPort(listen, 'listen')
  const owners = new Map()
  let claimed
  const all = new Promise((resolve) => { claimed = resolve })
  const server = createServer((socket) => {
    socket.setNoDelay(true)
    let launcher
    const send = jsonLines(socket, (m) => {
      if (launcher) return launcher.receive(m)
      const names = Array.isArray(m.agents) ? m.agents : []
      const other = names.find((n) => !wanted.includes(n) || owners.has(n))
      const refused = m.type !== 'hello' ? `${m.type} before hello` : !names.length ? 'no agents named' : other && `${other} is not this router's to give`
      if (refused) {
        send({ type: 'end', ok: false, line: `refused: ${refused} (it waits for launchers of ${wanted.filter((n) => !owners.has(n)).join(', ') || 'nothing'})` })
        return void socket.end()
      }
      launcher = remote(socket, send, m.host ?? socket.remoteAddress)
      for (const name of names) owners.set(name, launcher)
      log(`${launcher.where} owns ${names.join(', ')}`)
      if (wanted.every((n) => owners.has(n))) claimed()
    })
    socket.on('error', (error) => log(`a launcher's connection: ${error.message}`))
  })
  server.listen(port, host)
  await once(server, 'listening')
  log(`waiting at ${listen} for launchers of ${wanted.join(', ')}`)
  if (wanted.length) {
    let timer
    await Promise.race([all, new Promise((resolve, reject) => { timer = setTimeout(() => reject(new Error(`no launcher claimed ${wanted.filter((n) => !owners.has(n)).join(', ')} within ${TIMEOUT} ms`)), TIMEOUT) })])
      .finally(() => clearTimeout(timer))
  }
  return { server, owners }
}

// --- the router ---------------------------------------------------------------
/** Starts an agent process (here, or through the launcher that owns it); resolves with it once its agent is registered in etcd. */
function spawnAgent(launcher, role, name, endpoint, port, onMessage) {
  const args = ['--role', role, '--name', name, '--etcd', endpoint, '--port', String(port),
    '--window', String(WINDOW), '--block-kib', String(BLOCK / 1024), '--max-blocks', String(MAX_BLOCKS),
    '--ttl', String(TTL), '--request-timeout-ms', String(REQUEST_TIMEOUT), '--timeout-ms', String(TIMEOUT)]
  const agent = { role, name, where: launcher.where, launcher, pid: undefined, incarnation: undefined, port: undefined }
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start within ${TIMEOUT} ms`)), TIMEOUT)
    Object.assign(agent, launcher.start(name, args, (m) => {
      if (m.type === 'ready') {
        clearTimeout(timer)
        Object.assign(agent, { incarnation: m.incarnation, port: m.port, pid: m.pid })
        resolve(agent)
      }
      onMessage(agent, m)
    }))
    agent.exited.then((code) => { clearTimeout(timer); reject(new Error(`${name} exited (${code}) before it was ready`)) })
  })
}

async function router() {
  // The agents this process starts itself; with --listen, launchers on other hosts claim the others.
  const mine = agentNames(NAMES)
  if (!v.listen && mine.length < NAMES.length) { console.error(`--agents without --listen: nobody would start ${NAMES.filter((n) => !mine.includes(n)).join(', ')}\n${usage}`); process.exit(2) }
  let etcd
  let endpoint = v.etcd
  if (!endpoint) {
    const { etcdBinary, startEtcd } = await import('../scripts/etcd-server.mjs')
    if (!etcdBinary()) {
      console.error("etcd is not installed (Debian's etcd-server; in the guest: bash scripts/softroce.sh provision), or pass --etcd URL")
      process.exit(2)
    }
    // With launchers elsewhere, on the address they connect to (free ports there), so that their agents reach it too.
    etcd = await startEtcd(v.listen ? { host: hostPort(v.listen, 'listen')[0] } : {})
    endpoint = etcd.endpoint
    console.log(`etcd: ${endpoint} (private, data in ${etcd.dataDir})`)
  }
  const started = performance.now()
  const random = seeded(42)
  // The router moves no bytes: its agent is its view of the cluster (members(), peerJoined/peerLeft).
  const view = await createAgent('router', endpoint)
  const requests = Array.from({ length: REQUESTS }, (_, id) => ({
    id, seed: id * 7 + 1, blocks: Math.ceil(MAX_BLOCKS / 3) + Math.floor(random() * (MAX_BLOCKS - Math.ceil(MAX_BLOCKS / 3) + 1)),
    attempts: 0, current: undefined, delivered: false, lost: false, avoid: undefined,
  }))
  // The last AFTER requests wait for decode-1 to be back, so the run shows the new incarnation serving too.
  const AFTER = Math.min(int('after-restart', 0, REQUESTS), REQUESTS - 1)
  const pending = requests.slice(0, REQUESTS - AFTER)
  const held = requests.slice(REQUESTS - AFTER)
  const inFlight = new Set()
  const pools = new Map() // decode incarnation -> its free slots, as the router hands them out
  const down = new Map() // decode incarnation -> until when it is not routed to (it failed a request)
  const failures = new Map() // code -> count
  const checkedBy = new Map() // decode name -> { requests, incarnations }
  const stats = { delivered: 0, blocks: 0, bytes: 0, rerouted: new Set(), misdelivered: 0, bad: 0, stale: 0 }
  const agents = new Map()
  // Killed while the first REQUESTS - AFTER are being sent (so with requests in flight to it).
  const killAfter = Math.min(v['kill-after'] === undefined ? Math.floor(REQUESTS / 4) : int('kill-after', 0, REQUESTS), Math.max(0, REQUESTS - AFTER - 1))
  let kill = { state: 'waiting' }
  let turn = 0
  let prefillTurn = 0
  let finish
  const finished = new Promise((resolve) => { finish = resolve })

  const onMessage = (agent, m) => {
    if (m.type === 'written' || m.type === 'failed' || m.type === 'verified') {
      const request = requests[m.id]
      const attempt = request?.current
      if (!attempt || attempt.n !== m.attempt || attempt.settled) {
        if (m.type === 'verified') stats.stale++ // an attempt the router gave up on already
        return
      }
      if (m.type === 'written') return void (attempt.written = true)
      if (m.type === 'failed') return settleFailed(attempt, m.code, m.message)
      if (m.misdelivered) stats.misdelivered++
      stats.bad += m.bad
      if (m.bad > 0 || m.misdelivered) return settleFailed(attempt, 'BAD_BLOCKS', `${m.name} found ${m.bad} of ${m.blocks} blocks wrong`)
      settle(attempt)
      request.delivered = true
      stats.delivered++
      stats.blocks += m.blocks
      stats.bytes += m.blocks * BLOCK
      const by = checkedBy.get(m.name) ?? { requests: 0, incarnations: new Set() }
      by.requests++
      by.incarnations.add(m.incarnation)
      checkedBy.set(m.name, by)
      if (stats.delivered % 8 === 0) log(`${stats.delivered}/${REQUESTS} requests delivered and verified`)
      schedule()
    }
  }

  const settle = (attempt) => {
    attempt.settled = true
    clearTimeout(attempt.timer)
    inFlight.delete(attempt)
    pools.get(attempt.incarnation)?.push(...attempt.slots)
  }

  /** The attempt failed: the request goes to another decode agent, unless it has had MAX_ATTEMPTS. */
  const settleFailed = (attempt, code, message) => {
    settle(attempt)
    failures.set(code, (failures.get(code) ?? 0) + 1)
    const request = attempt.request
    const again = request.attempts < MAX_ATTEMPTS
    log(`request ${request.id} (attempt ${attempt.n}) to ${attempt.decode} via ${attempt.prefill} failed: ${code}: ${message.split('\n')[0].slice(0, 160)}${again ? '; re-routed' : '; given up'}`)
    // That incarnation is not routed to for a TTL (a dead agent stays listed that long); a new incarnation is at once.
    if (code !== 'PREFILL_BUSY' && code !== 'BAD_BLOCKS') down.set(attempt.incarnation, Date.now() + TTL * 1000)
    if (again) {
      stats.rerouted.add(request.id)
      request.avoid = attempt.decode
      pending.unshift(request)
    } else {
      request.lost = true
    }
    schedule()
  }

  // An incarnation that leaves the cluster confirms nothing more: its unconfirmed requests go elsewhere.
  view.on('peerLeft', ({ record, reason }) => {
    if (!record.name.startsWith('decode-')) return
    log(`${record.name} (incarnation ${record.incarnation.slice(0, 8)}) left the cluster (${reason})`)
    pools.delete(record.incarnation)
    for (const attempt of [...inFlight]) {
      if (attempt.incarnation === record.incarnation) settleFailed(attempt, 'PEER_LEFT', `${record.name} left the cluster (${reason}) before it confirmed the request${attempt.written ? ' (the write had completed)' : ''}`)
    }
  })
  view.on('peerJoined', (record) => {
    if (!record.name.startsWith('decode-')) return
    if (!pools.has(record.incarnation)) pools.set(record.incarnation, [...Array(SLOTS).keys()])
    schedule()
  })

  /** A decode agent for `request`, by name, from the router's etcd view: round robin, another than the one that just failed it. */
  const pickDecode = (request) => {
    const live = [...view.members().values()].filter((r) => r.name.startsWith('decode-') && !((down.get(r.incarnation) ?? 0) > Date.now()) &&
      (pools.get(r.incarnation)?.length ?? 0) >= request.blocks)
      .sort((a, b) => a.name.localeCompare(b.name))
    const choices = live.length > 1 ? live.filter((r) => r.name !== request.avoid) : live
    return choices.length ? choices[turn++ % choices.length] : undefined
  }

  let retryTimer
  let running = false // from when every agent is up
  function schedule() {
    if (!running) return
    while (pending.length && inFlight.size < WINDOW) {
      const request = pending[0]
      const record = pickDecode(request)
      if (!record) break // no decode agent with room: wait for a confirmation or a join
      pending.shift()
      dispatch(request, record)
    }
    if (stats.delivered + requests.filter((r) => r.lost).length === REQUESTS) return finish()
    // Room in the window but no decode agent to send to: look again soon (one marked down may be due again).
    if (pending.length && inFlight.size < WINDOW && !retryTimer) retryTimer = setTimeout(() => { retryTimer = undefined; schedule() }, 200)
  }

  function dispatch(request, record) {
    const prefill = agents.get(`prefill-${prefillTurn++ % 2}`)
    request.attempts++
    const attempt = { request, n: request.attempts, decode: record.name, incarnation: record.incarnation, prefill: prefill.name,
      slots: take(pools.get(record.incarnation), request.blocks, random), settled: false, written: false }
    // A safety net, not a measurement: an attempt nobody settles (a hung process) is re-routed.
    attempt.timer = setTimeout(() => settleFailed(attempt, 'ETIMEDOUT', `no confirmation within ${TIMEOUT} ms`), TIMEOUT)
    request.current = attempt
    inFlight.add(attempt)
    prefill.send({ type: 'write', id: request.id, attempt: attempt.n, seed: request.seed, decode: record.name, incarnation: record.incarnation, slots: attempt.slots })
    if (kill.state === 'waiting' && record.name === 'decode-1' && stats.delivered >= killAfter) void killAndRestart()
  }

  /** SIGKILL decode-1 with this request (and perhaps others) in flight to it, then start it again: same name, same port. */
  async function killAndRestart() {
    const victim = agents.get('decode-1')
    const inFlightThere = [...inFlight].filter((a) => a.incarnation === victim.incarnation).length
    kill = { state: 'killed', incarnation: victim.incarnation, inFlight: inFlightThere }
    log(`killing decode-1 (pid ${victim.pid} on ${victim.where}, incarnation ${victim.incarnation.slice(0, 8)}) with ${inFlightThere} request(s) in flight to it`)
    victim.kill() // SIGKILL, by the process that forked it
    const how = await victim.exited
    log(`decode-1 is dead (${how}); restarting it as decode-1 on port ${victim.port}`)
    try {
      const again = await spawnAgent(victim.launcher, 'decode', 'decode-1', endpoint, victim.port, onMessage)
      agents.set('decode-1', again)
      kill.state = 'restarted'
      pending.push(...held.splice(0))
      schedule()
      log(`decode-1 is back (incarnation ${again.incarnation.slice(0, 8)}, port ${again.port})`)
    } catch (error) {
      kill.state = 'not restarted'
      pending.push(...held.splice(0))
      schedule()
      console.error(`router: ${error.message}`)
    }
  }

  let exitCode = 1
  let verdict = 'FAILED: the router stopped before the end'
  let launchers
  try {
    const names = NAMES
    if (v.listen) launchers = await acceptLaunchers(v.listen, names.filter((n) => !mine.includes(n)))
    const launcherOf = (name) => launchers?.owners.get(name) ?? here
    for (const agent of await Promise.all(names.map((name) => spawnAgent(launcherOf(name), name.split('-')[0], name, endpoint, 0, onMessage)))) agents.set(agent.name, agent)
    // Wait until the router's watch shows all four (they registered before saying 'ready').
    for (const deadline = Date.now() + TIMEOUT; !names.every((n) => view.members().has(n));) {
      if (Date.now() > deadline) throw new Error(`the router's view lacks ${names.filter((n) => !view.members().has(n)).join(', ')}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    log(`${[...view.members().values()].map((r) => `${r.name} at ${r.addresses[0].host}:${r.addresses[0].port}`).join(', ')}`)
    if (launchers) log(names.map((n) => `${n} on ${agents.get(n).where}`).join(', '))
    log(`${REQUESTS} requests of ${Math.ceil(MAX_BLOCKS / 3)}..${MAX_BLOCKS} blocks of ${BLOCK / 1024} KiB, ${WINDOW} in flight; decode-1 is killed after ${killAfter}`)
    running = true
    schedule()
    const overall = setTimeout(() => { log(`not done within ${TIMEOUT} ms`); finish() }, TIMEOUT)
    await finished
    clearTimeout(overall)
    if (kill.state === 'killed') await new Promise((resolve) => { const t = setInterval(() => { if (kill.state !== 'killed') { clearInterval(t); resolve() } }, 50) })
    const lost = requests.filter((r) => !r.delivered).length
    const seconds = (performance.now() - started) / 1000
    const codes = [...failures].map(([code, n]) => `${code} ${n}`).join(', ') || 'none'
    console.log(`checked: ${[...checkedBy].sort().map(([name, by]) => `${name} ${by.requests} requests (${by.incarnations.size} incarnation${by.incarnations.size > 1 ? 's' : ''})`).join(', ')}`)
    console.log(`failed attempts: ${codes}`)
    console.log(`summary requests=${REQUESTS} delivered=${stats.delivered} lost=${lost} blocks=${stats.blocks} bytes=${stats.bytes} ` +
      `rerouted=${stats.rerouted.size} failed_attempts=${[...failures.values()].reduce((a, b) => a + b, 0)} misdelivered=${stats.misdelivered} bad_blocks=${stats.bad} ` +
      `stale_reports=${stats.stale} killed=${kill.state === 'waiting' ? 0 : 1} in_flight_at_kill=${kill.inFlight ?? 0} seconds=${seconds.toFixed(1)}`)
    const ok = lost === 0 && stats.misdelivered === 0 && stats.bad === 0 && kill.state === 'restarted'
    verdict = ok ? `ok: all ${REQUESTS} requests delivered once and every block verified (${(stats.bytes / 2 ** 20).toFixed(1)} MiB); ${stats.rerouted.size} re-routed after decode-1 was killed`
      : `FAILED: ${lost} lost, ${stats.misdelivered} misdelivered, ${stats.bad} bad blocks${kill.state === 'restarted' ? '' : ', decode-1 was not killed and restarted'}`
    console.log(verdict)
    exitCode = ok ? 0 : 1
  } catch (error) {
    console.error(`router: ${error.stack ?? error}`)
  } finally {
    // Children close their agents (leases revoked) and exit; anything left after the bound is killed.
    for (const agent of agents.values()) agent.send({ type: 'stop' })
    await Promise.all([...agents.values()].map((agent) => Promise.race([agent.exited, new Promise((resolve) => setTimeout(resolve, 15_000))])))
    for (const agent of agents.values()) agent.kill()
    // Launchers hear the verdict, then their connection ends (they exit with it).
    await Promise.all([...new Set(launchers?.owners.values() ?? [])].map((launcher) => launcher.end({ type: 'end', ok: exitCode === 0, line: verdict })))
    launchers?.server.close()
    await view.close()
    await etcd?.stop()
  }
  process.exit(exitCode)
}

// --- a launcher: the agents of this host, started, killed and stopped on the router's word ---
async function launcher() {
  if (!v.router || v.agents === undefined) { console.error(`--role launcher needs --router ADDR:PORT and --agents NAMES\n${usage}`); process.exit(2) }
  const [host, port] = hostPort(v.router, 'router')
  const names = agentNames([])
  // The router may not listen yet (it starts etcd first): dial again until it answers, within --timeout-ms.
  let socket
  for (const deadline = Date.now() + TIMEOUT; !socket;) {
    const attempt = connect({ host, port })
    try {
      await once(attempt, 'connect')
      socket = attempt
    } catch (error) {
      attempt.destroy()
      if (Date.now() > deadline) { console.error(`launcher: the router at ${v.router} did not answer within ${TIMEOUT} ms: ${error.message}`); process.exit(1) }
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
  socket.setNoDelay(true)
  const children = new Map() // name -> the handle of the agent started last under that name
  let last
  const send = jsonLines(socket, (m) => {
    if (m.type === 'start') {
      if (!names.includes(m.name)) return send({ type: 'exit', name: m.name, code: `not one of ${names.join(',')}` })
      // The router's arguments; this host's own --host and --device (here.start adds them).
      const child = here.start(m.name, m.args, (message) => send({ type: 'message', name: m.name, message }))
      children.set(m.name, child)
      child.exited.then((code) => {
        if (children.get(m.name) === child) children.delete(m.name)
        send({ type: 'exit', name: m.name, code })
      })
      log(`started ${m.name}`)
    } else if (m.type === 'send') {
      children.get(m.name)?.send(m.message)
    } else if (m.type === 'kill') {
      log(`killing ${m.name} (SIGKILL), as the router asks`)
      children.get(m.name)?.kill()
    } else if (m.type === 'end') {
      last = m
    }
  })
  socket.on('error', (error) => log(`the router's connection: ${error.message}`))
  send({ type: 'hello', agents: names, host: localAddress(v.host, device) })
  log(`connected to the router at ${v.router}, for ${names.join(', ')}`)
  await once(socket, 'close')
  // The router is done (or gone): what is left stops (stop, else SIGKILL after 15 s).
  const left = [...children.values()]
  for (const child of left) child.send({ type: 'stop' })
  await Promise.all(left.map((child) => Promise.race([child.exited, new Promise((resolve) => setTimeout(resolve, 15_000))])))
  for (const child of left) child.kill()
  console.log(last ? `the router's verdict: ${last.line}` : 'FAILED: the router went away without a verdict')
  process.exit(last?.ok ? 0 : 1)
}

if (v.role === 'router') await router()
else if (v.role === 'launcher') await launcher()
else if (v.role === 'decode' || v.role === 'prefill') {
  if (!v.name || !v.etcd) { console.error(`--role ${v.role} needs --name and --etcd\n${usage}`); process.exit(2) }
  await (v.role === 'decode' ? decodeAgent(v.name, v.etcd, int('port', 0, 65535)) : prefillAgent(v.name, v.etcd))
} else {
  console.error(`--role is router, launcher, prefill or decode\n${usage}`)
  process.exit(2)
}
