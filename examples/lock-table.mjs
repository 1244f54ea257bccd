#!/usr/bin/env node
// A lock table on one-sided atomics, the way FaRM/DrTM-style systems keep
// locks in remote memory: the server registers M lock words, M fencing
// counters and M protected records, then its CPU does nothing until the end.
// Client processes (connected with rdma_cm) take a lock with CAS (its new
// word carries the fencing token), install the token in the record's fence word, READ
// the record's counter, add one, WRITE it back and release with CAS. A lost
// update would mean two clients held a lock at once, so at the end the server
// checks every counter against the increments the clients say they made.
//
//   node examples/lock-table.mjs [--clients 8] [--locks 4] [--ops 500] [--kill-holder]
//        [--lease-ms 2000] [--host H] [--port 0] [--timeout-ms 120000]
//   --unlocked: the same rounds without taking the locks, to see the check catch lost updates
//   two hosts:   --role server --clients N ... (on one host), --role clients --host H --port P ... (on the other)
//
// --kill-holder first starts a client that takes lock 0 and is then killed
// with SIGKILL while it holds it: the other clients steal lock 0 once its
// lease has run out, and at the end the dead holder's fencing token is
// replayed and must be refused (and its release must find the lock lost).
//
// Server memory, M = --locks (one region, 32*M bytes, all 8-byte aligned):
//   [0, 8M)      lock words       owner(16 bits, 0 = free) | sequence(48 bits, +1 per acquisition: the token)
//   [8M, 16M)    ticket counters  unused by these spin locks (a FIFO table's tickets: docs/locks.md)
//   [16M, 32M)   records          16 bytes each: fence word (largest token installed), counter
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { exampleArgs } from './cli-args.mjs'
import { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, RemoteLockTable } from 'node-ibverbs'

const usage = `usage: lock-table.mjs [--clients 8] [--processes N] [--locks 4] [--ops 500] [--kill-holder] [--lease-ms 2000]
                     [--acquire-timeout-ms 60000] [--host H] [--port 0] [--timeout-ms 120000] [--role all|server|clients]`
const { values: v, int } = exampleArgs(usage, {
  role: { type: 'string', default: 'all' }, // all | server | clients; client and holder are this program's children
  clients: { type: 'string', default: '8' },
  processes: { type: 'string' }, // client processes (default: one per client); clients are spread over them
  'acquire-timeout-ms': { type: 'string', default: '60000' },
  locks: { type: 'string', default: '4' },
  ops: { type: 'string', default: '500' },
  'kill-holder': { type: 'boolean', default: false },
  unlocked: { type: 'boolean', default: false }, // skip the locks: shows the exactness check catching lost updates
  'lease-ms': { type: 'string', default: '2000' },
  host: { type: 'string' },
  port: { type: 'string', default: '0' },
  'timeout-ms': { type: 'string', default: '120000' },
  id: { type: 'string', default: '1' },
  seed: { type: 'string', default: '1' },
})
const CLIENTS = int('clients', 1, 1000)
const LOCKS = int('locks', 1, 65536)
const OPS = int('ops', 0, 1e9)
const LEASE_MS = int('lease-ms', 1, 600_000)
const TIMEOUT_MS = int('timeout-ms', 1, 2 ** 31 - 1)
const ACQUIRE_TIMEOUT_MS = int('acquire-timeout-ms', 1, 2 ** 31 - 1)
if (v.processes === undefined) v.processes = String(CLIENTS)
const PROCESSES = int('processes', 1, CLIENTS)
const role = v.role
const self = fileURLToPath(import.meta.url)

const watchdog = setTimeout(() => {
  console.error(`lock-table ${role}: FAILED: timed out after ${TIMEOUT_MS} ms`)
  process.exit(1)
}, TIMEOUT_MS)
watchdog.unref()

/** The device's IPv4 address for rdma_cm (the guest's $SOFTROCE_ADDR). */
function localAddress(device) {
  const v4 = device.gids(1).find((g) => g.gid.startsWith('::ffff:'))
  const host = v.host ?? process.env.SOFTROCE_ADDR ?? v4?.gid.slice(7)
  if (!host) throw new Error(`${device.name} has no IPv4 address for rdma_cm`)
  return host
}

// The table's layout, for M locks in a region seen from a client.
const layout = (remote) => {
  const m = remote.length / 32
  return {
    locks: m,
    lockWords: remote.slice(0, 8 * m),
    tokens: remote.slice(8 * m, 8 * m),
    fence: (lock) => remote.slice(16 * m + 16 * lock, 8),
    counter: (lock) => remote.slice(16 * m + 16 * lock + 8, 8),
  }
}

// --- server: registers the table, accepts clients, checks the counters at the end -----------
async function serve({ clients, onListening }) {
  const device = openDevice(process.env.NODE_IBVERBS_DEVICE || process.env.SOFTROCE_DEVICE || undefined)
  const pd = device.allocPd()
  const table = pd.allocRegion(32 * LOCKS, Access.LocalWrite | Access.RemoteRead | Access.RemoteWrite | Access.RemoteAtomic)
  table.bytes.fill(0)
  const host = localAddress(device)
  const listener = await listen({ host, port: int('port', 0, 65535), pd })
  const connections = []
  const reports = []
  const ready = [] // connections whose client said "ready"
  const expectedReports = clients
  let allReported
  const reported = new Promise((resolve) => { allReported = resolve })
  const serving = (async () => {
    for (;;) {
      const request = await listener.accept()
      if (!request) return
      // One failed accept (a client that gave up, a slow guest) must not take the server down: that client fails instead.
      let conn
      try {
        conn = await request.accept({ privateData: encodeDescriptors([table.describe()]), receiveJson: true, timeoutMs: 60_000 })
      } catch (error) {
        console.error(`lock-table server: accept failed: ${error.code} ${error.message}`)
        continue
      }
      connections.push(conn)
      // A client sends "ready", waits for "go", then sends its report at the end (a killed holder, and
      // the replay, send nothing). "go" goes out when every client is ready, so the rounds overlap:
      // without that a fast client could finish before a slow one connects, and the exactness check
      // would prove nothing about exclusion.
      conn.receiveJson().then((hello) => {
        if (!hello?.ready) throw new Error(`expected "ready", got ${JSON.stringify(hello)}`)
        const report = conn.receiveJson() // posted before "go": the report may follow at once
        ready.push(conn)
        if (ready.length === expectedReports) for (const c of ready) c.sendJson({ go: true }).catch(() => {})
        return report
      }).then((report) => {
        reports.push(report)
        if (reports.length === expectedReports) allReported()
      }, () => {})
    }
  })()
  serving.catch((error) => { console.error(`lock-table server: ${error.stack ?? error}`); process.exit(1) })
  const port = listener.address.port
  await onListening({ host, port })
  await reported
  listener.close()

  // Each record's counter must equal the increments the clients made under its lock: a lost update is an exclusion failure.
  const view = new DataView(table.bytes.buffer, table.bytes.byteOffset, table.bytes.byteLength)
  let ok = true
  const exact = []
  for (let lock = 0; lock < LOCKS; lock++) {
    const expected = reports.reduce((sum, r) => sum + r.increments[lock], 0)
    const counted = Number(view.getBigUint64(16 * LOCKS + 16 * lock + 8, true))
    const word = view.getBigUint64(8 * lock, true)
    const free = word >> 48n === 0n // no owner (the sequence stays: the next holder's token is larger)
    exact.push({ lock, expected, counted, lastToken: Number(word & 0xffffffffffffn), free })
    if (expected !== counted || !free) ok = false
  }
  const total = (key) => reports.reduce((sum, r) => sum + r[key], 0)
  const summary = {
    clients: reports.length, locks: LOCKS, opsPerClient: OPS, exact,
    expected: exact.reduce((s, e) => s + e.expected, 0), counted: exact.reduce((s, e) => s + e.counted, 0),
    steals: total('steals'), leaseLapses: total('leaseLapses'), lostReleases: total('lostReleases'), fenced: total('fenced'), contended: total('contended'),
    stolenWords: reports.flatMap((r) => r.stolenWords),
  }
  for (const e of exact) console.log(`lock ${e.lock}: expected ${e.expected} increments, counted ${e.counted}, last token ${e.lastToken}, ${e.free ? 'free' : 'STILL HELD'}`)
  return { ok, summary, host, port, device, pd, table, connections, close: () => { for (const c of connections) c.close(); device.close() } }
}

// --- client process: one connection per client id, rounds of lock / READ+1+WRITE / unlock ---
async function clientProcess() {
  const first = int('id', 1, 65535)
  const count = role === 'holder' ? 1 : int('clients', 1, 1000)
  const loaded = performance.now() // since this process started
  await Promise.all(Array.from({ length: count }, (_, i) => client(first + i, loaded)))
}

async function client(id, loaded) {
  const conn = await connectRetrying(v.host, int('port', 1, 65535))
  const connectedMs = performance.now() - loaded
  const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
  const t = layout(remote)
  const locks = new RemoteLockTable(conn.qp, { locks: t.lockWords, tokens: t.tokens, owner: id, leaseMs: LEASE_MS })
  const local = conn.pd.allocRegion(8, Access.LocalWrite)
  const value = new DataView(local.bytes.buffer, local.bytes.byteOffset, 8)
  const report = { id, increments: new Array(t.locks).fill(0), steals: 0, stolenWords: [], leaseLapses: 0, lostReleases: 0, fenced: 0, acquireMs: 0, contended: 0 }
  let seed = (int('seed', 0, 2 ** 31) * 7919 + id * 104729) >>> 0
  const random = () => (seed = (seed * 1664525 + 1013904223) >>> 0) >>> 8

  if (role === 'holder') {
    // Take lock 0, fence its record, say so, and wait to be killed.
    const grant = await locks.acquire(0, { timeoutMs: ACQUIRE_TIMEOUT_MS })
    await locks.fence(grant.token, t.fence(0))
    console.log(`holding ${JSON.stringify({ lock: 0, token: String(grant.token), word: String(grant.word) })}`)
    await new Promise((resolve) => setTimeout(resolve, TIMEOUT_MS))
    process.exit(3) // never killed: the test fails on this exit code
  }

  // Start together with every other client (the server says "go" once all are ready).
  const go = conn.receiveJson({ timeoutMs: TIMEOUT_MS }) // posted before "ready": "go" may come at once
  await conn.sendJson({ ready: id })
  await go
  const started = performance.now()
  for (let round = 0; round < OPS && v.unlocked; round++) {
    const lock = random() % t.locks
    await conn.qp.read(local.slice(0, 8), t.counter(lock))
    value.setBigUint64(0, value.getBigUint64(0, true) + 1n, true)
    await conn.qp.write(local.slice(0, 8), t.counter(lock))
    report.increments[lock]++
  }
  for (let round = 0; round < OPS && !v.unlocked; round++) {
    const lock = random() % t.locks
    const before = performance.now()
    const grant = await locks.acquire(lock, { timeoutMs: ACQUIRE_TIMEOUT_MS })
    report.acquireMs += performance.now() - before
    if (grant.stolenFrom !== undefined) { report.steals++; report.stolenWords.push(String(grant.stolenFrom)) }
    if (grant.attempts > 1) report.contended++ // found the lock held at least once: exclusion was exercised
    try {
      // Fence and READ go out together (one round trip): the QP executes them in order at the server.
      const [fenced, read] = await Promise.allSettled([locks.fence(grant.token, t.fence(lock)), conn.qp.read(local.slice(0, 8), t.counter(lock))])
      if (fenced.status === 'rejected') throw fenced.reason
      if (read.status === 'rejected') throw read.reason
      value.setBigUint64(0, value.getBigUint64(0, true) + 1n, true)
      // Write only with a quarter of the lease to spare: past the lease, a thief may already hold the lock.
      locks.checkLease(grant, LEASE_MS / 4)
      await conn.qp.write(local.slice(0, 8), t.counter(lock))
      report.increments[lock]++
    } catch (error) {
      if (error.code === 'ERR_LOCK_LEASE_EXPIRED') { report.leaseLapses++; round-- } // nothing written: do the round again
      else if (error.code === 'ERR_LOCK_FENCED') { report.fenced++; round-- }
      else throw error
    }
    try {
      await locks.release(grant)
    } catch (error) {
      if (error.code !== 'ERR_LOCK_LOST') throw error
      report.lostReleases++
    }
  }
  report.acquireMs = Math.round(report.acquireMs)
  report.seconds = (performance.now() - started) / 1000
  await conn.sendJson(report)
  console.log(`client ${id}: process started in ${(loaded / 1000).toFixed(1)} s, connected after ${(connectedMs / 1000).toFixed(1)} s, ` +
    `${OPS} rounds in ${report.seconds.toFixed(2)} s, ${report.steals} steals`)
  await conn.disconnect()
  local.deregister()
}

/** Connects, retrying a refused or timed-out connection: on two hosts the server may still be starting. */
async function connectRetrying(host, port) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await connect({ host, port, timeoutMs: 60_000 })
    } catch (error) {
      if (!(error.code === 'ECONNREFUSED' && attempt < 120) && !(error.code === 'ETIMEDOUT' && attempt < 3)) throw error
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
}

/** Spawns one child of this program; resolves with its exit, rejects on failure. */
function child(args, onLine = () => {}) {
  const pass = [...(v.unlocked ? ['--unlocked'] : []), '--lease-ms', String(LEASE_MS), '--timeout-ms', String(TIMEOUT_MS), '--acquire-timeout-ms', String(ACQUIRE_TIMEOUT_MS), '--seed', v.seed]
  const proc = spawn(process.execPath, [self, ...args, ...pass], { stdio: ['ignore', 'pipe', 'inherit'] })
  createInterface({ input: proc.stdout }).on('line', (line) => { onLine(line, proc); if (!line.startsWith('holding ')) console.log(line) })
  const exited = new Promise((resolve) => proc.on('close', (code, signal) => resolve({ code, signal })))
  return { proc, exited }
}

async function runClients(host, port, firstId = 1) {
  // Clients are spread over PROCESSES processes, each with its share of connections (ids stay 1..CLIENTS).
  const kids = []
  for (let p = 0, id = firstId; p < PROCESSES; p++) {
    const share = Math.floor(CLIENTS / PROCESSES) + (p < CLIENTS % PROCESSES ? 1 : 0)
    kids.push(child(['--role', 'client', '--host', host, '--port', String(port), '--id', String(id), '--clients', String(share), '--ops', String(OPS)]))
    id += share
  }
  const exits = await Promise.all(kids.map((k) => k.exited))
  const failed = exits.filter((e) => e.code !== 0)
  if (failed.length) throw new Error(`${failed.length} client processes failed: ${JSON.stringify(failed)}`)
}

/** Starts a holder, waits until it holds lock 0, kills it with SIGKILL. Returns what it held. */
async function killHolder(host, port, id) {
  let held
  const holder = child(['--role', 'holder', '--host', host, '--port', String(port), '--id', String(id)], (line, proc) => {
    if (!line.startsWith('holding ')) return
    held = JSON.parse(line.slice('holding '.length))
    proc.kill('SIGKILL')
  })
  const exit = await holder.exited
  if (exit.signal !== 'SIGKILL' || !held) throw new Error(`the holder did not get killed while holding: ${JSON.stringify(exit)}`)
  console.log(`holder (client ${id}) killed with SIGKILL while holding lock 0 with token ${held.token}`)
  return { lock: 0, token: BigInt(held.token), word: BigInt(held.word), leaseEndsAt: 0, stolenFrom: undefined, attempts: 1 }
}

/** Replays a dead holder's token and release over a fresh connection: both must be refused. */
async function replay(host, port, dead) {
  const conn = await connect({ host, port, timeoutMs: 30_000 })
  const t = layout(remoteRegion(decodeDescriptors(conn.privateData)[0]))
  const locks = new RemoteLockTable(conn.qp, { locks: t.lockWords, tokens: t.tokens, owner: 65535, leaseMs: LEASE_MS })
  const refused = async (what, action) => {
    try { await action() } catch (error) { return `${what}: ${error.code}` }
    return `${what}: ACCEPTED`
  }
  const fence = await refused('replayed fence', () => locks.fence(dead.token, t.fence(dead.lock)))
  const release = await refused('replayed release', () => locks.release(dead))
  await conn.disconnect()
  return { fence, release }
}

if (role === 'client' || role === 'holder') {
  await clientProcess()
} else if (role === 'clients') {
  // Two hosts: this host only runs the clients, against --host/--port.
  if (!v.host) throw new Error('--role clients needs --host (the server\'s address) and --port')
  await runClients(v.host, int('port', 1, 65535))
  console.log(`lock-table clients: ${CLIENTS} clients in ${PROCESSES} processes x ${OPS} rounds done`)
} else if (role === 'server' || role === 'all') {
  let dead
  let replayed
  const served = await serve({
    clients: CLIENTS,
    onListening: async ({ host, port }) => {
      console.log(`lock-table server: ${LOCKS} locks on ${host}:${port}, lease ${LEASE_MS} ms; ${CLIENTS} clients in ${role === 'all' ? PROCESSES : 'remote'} processes`)
      if (role === 'server') return
      if (v['kill-holder']) dead = await killHolder(host, port, CLIENTS + 1)
      await runClients(host, port)
      if (dead) replayed = await replay(host, port, dead) // the listener is still open here
    },
  })
  const s = served.summary
  let ok = served.ok
  console.log(`exactness: expected ${s.expected} increments, counted ${s.counted} (${s.clients} clients x ${s.opsPerClient} rounds on ${s.locks} locks); ` +
    `contended acquisitions ${s.contended}, steals ${s.steals}, lease lapses ${s.leaseLapses}, lost releases ${s.lostReleases}, fenced ${s.fenced}` +
    (s.counted < s.expected ? `; ${s.expected - s.counted} updates lost` : ''))
  if (dead) {
    const stolen = s.stolenWords.includes(String(dead.word))
    console.log(`kill-holder: dead holder's word ${stolen ? 'was stolen' : 'was NOT stolen'}; ${replayed.fence}; ${replayed.release}`)
    ok &&= stolen && replayed.fence.endsWith('ERR_LOCK_FENCED') && replayed.release.endsWith('ERR_LOCK_LOST')
  }
  served.close()
  console.log(ok ? 'lock-table: OK' : 'lock-table: FAILED')
  if (!ok) process.exitCode = 1
} else {
  console.error(`unknown --role ${role}\n${usage}`)
  process.exit(2)
}
clearTimeout(watchdog)
