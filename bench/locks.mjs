#!/usr/bin/env node
// `npm run bench -- locks`: what a lock table on one-sided atomics
// (lib/locks RemoteLockTable) costs, next to perftest's ib_atomic_bw and
// ib_atomic_lat in the same boot.
//   - uncontended acquire+release latency (1 client, 1 lock: CAS + FETCH_ADD + CAS),
//     next to one CAS round trip of ours and ib_atomic_lat's;
//   - throughput at 1, 4 and 8 clients: acquire+release pairs per second, each client
//     on its own lock (no contention), and full rounds (acquire, fence+READ, WRITE,
//     release) with all clients on 4 shared locks. Atomics/s = 3 per pair, compared
//     with ib_atomic_bw's message rate.
// Clients are connections (rdma_cm, own QP and CQ each) in this one process: the
// server side is registered memory only. Options: --seconds S (per point, default 4).
import { spawn } from 'node:child_process'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')

export async function main(argv) {
  const seconds = argv.includes('--seconds') ? Number(argv[argv.indexOf('--seconds') + 1]) : 4
  const { listDevices } = await import('../dist/index.js')
  if (!process.env.SOFTROCE_MODE && listDevices().length === 0) {
    console.error('bench locks: no RDMA device here; running inside the Soft-RoCE environment')
    const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--timeout', '1800', '--', process.execPath, fileURLToPath(import.meta.url), ...argv], { cwd: root, stdio: 'inherit' })
    process.exitCode = await new Promise((r) => child.on('close', r)) ?? 1
    return
  }
  const { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, RemoteLockTable } = await import('../dist/index.js')
  const { perftest, run, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const deviceName = process.env.SOFTROCE_DEVICE || process.env.NODE_IBVERBS_DEVICE || listDevices()[0].name
  const gidIndex = roceV2Ipv4GidIndex(deviceName)
  const log = (s) => process.stderr.write(s + '\n')

  // perftest first: the reference in this boot.
  // A failed perftest run (e.g. its 60 s limit on a busy machine) leaves its column empty, not the whole benchmark.
  const atomicBw = await perftest({ test: 'atomic_cas_bw', size: 8, iters: 3000, txDepth: 128, device: deviceName, gidIndex, addr: process.env.SOFTROCE_ADDR || '127.0.0.1' })
    .catch((e) => { log(`ib_atomic_bw failed: ${String(e.message).split('\n')[0]}`); return undefined })
  log(`ib_atomic_bw CAS: ${atomicBw?.mpps} Mpps`)
  const atomicLat = await perftestLat(run, deviceName, gidIndex).catch(() => undefined)
  log(`ib_atomic_lat CAS: typical ${atomicLat?.tTypical} µs`)

  // The table: 64 lock words, 64 counters, 64 records (fence, counter) in one region.
  const M = 64
  const device = openDevice(deviceName)
  const pd = device.allocPd()
  const table = pd.allocRegion(32 * M, Access.LocalWrite | Access.RemoteRead | Access.RemoteWrite | Access.RemoteAtomic)
  table.bytes.fill(0)
  const v4 = device.gids(1).find((g) => g.gid.startsWith('::ffff:'))
  const host = process.env.SOFTROCE_ADDR || v4.gid.slice(7)
  const listener = await listen({ host, port: 0, pd })
  const served = []
  void (async () => {
    for (let r; (r = await listener.accept());) served.push(await r.accept({ privateData: encodeDescriptors([table.describe()]) }))
  })()
  const clients = []
  for (let i = 0; i < 8; i++) {
    const conn = await connect({ host, port: listener.address.port, pd })
    const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
    const locks = new RemoteLockTable(conn.qp, { locks: remote.slice(0, 8 * M), tokens: remote.slice(8 * M, 8 * M), owner: i + 1, leaseMs: 10_000 })
    clients.push({ conn, remote, locks, local: pd.allocRegion(8, Access.LocalWrite) })
  }

  // Latency: one client, one lock, nothing else running.
  const c0 = clients[0]
  const lat = []
  const cas = []
  for (let i = 0; i < 1000; i++) {
    let t = performance.now()
    await c0.conn.qp.compareAndSwap(c0.remote.slice(8 * (M - 1), 8), 0n, 0n)
    cas.push((performance.now() - t) * 1000)
    t = performance.now()
    const grant = await c0.locks.acquire(0)
    await c0.locks.release(grant)
    lat.push((performance.now() - t) * 1000)
  }
  const q = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))] }
  log(`acquire+release: median ${q(lat, 0.5).toFixed(1)} µs; CAS: ${q(cas, 0.5).toFixed(1)} µs`)

  // Throughput: `n` clients for `seconds`, each running `body` in a loop.
  async function rate(n, body) {
    const end = performance.now() + seconds * 1000
    const counts = await Promise.all(clients.slice(0, n).map(async (c, i) => {
      let done = 0
      while (performance.now() < end) { await body(c, i); done++ }
      return done
    }))
    return counts.reduce((a, b) => a + b, 0) / seconds
  }
  const pair = async (c, i) => c.locks.release(await c.locks.acquire(i))
  let seed = 12345
  const round = async (c) => {
    seed = (seed * 1664525 + 1013904223) >>> 0
    const lock = (seed >>> 8) % 4
    const grant = await c.locks.acquire(lock, { timeoutMs: 60_000 })
    const record = 16 * M + 16 * lock
    await Promise.all([c.locks.fence(grant.token, c.remote.slice(record, 8)), c.conn.qp.read(c.local.slice(0, 8), c.remote.slice(record + 8, 8))])
    const view = new DataView(c.local.bytes.buffer, c.local.bytes.byteOffset, 8)
    view.setBigUint64(0, view.getBigUint64(0, true) + 1n, true)
    await c.conn.qp.write(c.local.slice(0, 8), c.remote.slice(record + 8, 8))
    await c.locks.release(grant)
  }
  const rows = []
  for (const n of [1, 4, 8]) {
    const pairs = await rate(n, pair)
    const rounds = await rate(n, round)
    rows.push({ n, pairs, rounds })
    log(`${n} clients: ${pairs.toFixed(0)} acquire+release/s, ${rounds.toFixed(0)} rounds/s on 4 locks`)
  }
  // The rounds must not have lost an update (cheap check of the benchmark itself).
  const view = new DataView(table.bytes.buffer, table.bytes.byteOffset, table.bytes.byteLength)
  let counted = 0
  for (let l = 0; l < 4; l++) counted += Number(view.getBigUint64(16 * M + 16 * l + 8, true))
  const expected = rows.reduce((s, r) => s + Math.round(r.rounds * seconds), 0)

  const f = (x, d = 0) => x.toFixed(d)
  const out = []
  out.push(`Lock table on ${deviceName} (Node ${process.version}, ${new Date().toISOString()}, ${seconds} s per point; clients are rdma_cm connections in one process)`)
  out.push('')
  out.push('| measure | perftest | ours | ratio |')
  out.push('|---|---:|---:|---:|')
  out.push(`| CAS round trip, typical µs (ib_atomic_lat / our compareAndSwap) | ${atomicLat ? f(atomicLat.tTypical, 1) : '–'} | ${f(q(cas, 0.5), 1)} | ${atomicLat ? f(q(cas, 0.5) / atomicLat.tTypical, 2) : '–'} |`)
  out.push(`| uncontended acquire+release, median µs (3 atomics) | – | ${f(q(lat, 0.5), 1)} | ${f(q(lat, 0.5) / q(cas, 0.5), 2)} × our CAS |`)
  out.push(`| uncontended acquire+release, p99 µs | – | ${f(q(lat, 0.99), 1)} | |`)
  out.push('')
  out.push(`| clients | acquire+release/s (own lock each) | atomics/s | ib_atomic_bw CAS msg/s | ratio | rounds/s on 4 shared locks |`)
  out.push('|---:|---:|---:|---:|---:|---:|')
  for (const r of rows) {
    const ref = atomicBw ? atomicBw.mpps * 1e6 : NaN
    out.push(`| ${r.n} | ${f(r.pairs)} | ${f(3 * r.pairs)} | ${atomicBw ? f(ref) : '–'} | ${atomicBw ? f((3 * r.pairs) / ref, 3) : '–'} | ${f(r.rounds)} |`)
  }
  out.push('')
  out.push(`Rounds check: ${counted} increments counted on the 4 shared locks (${expected} rounds measured, rounded per point).`)
  process.stdout.write(out.join('\n') + '\n')
  for (const c of clients) await c.conn.disconnect()
  listener.close()
  for (const s of served) s.close()
  device.close()
}

/** ib_atomic_lat (CAS), server and client on this device. */
async function perftestLat(run, device, gidIndex) {
  const { parse } = await import('./perftest.mjs')
  const port = String(19515 + Math.floor(Math.random() * 1000))
  const args = ['-A', 'CMP_AND_SWAP', '-d', device, '-x', String(gidIndex), '-F', '-p', port, '-n', '1000']
  const server = run('ib_atomic_lat', args, 60_000)
  let client
  for (let attempt = 0; attempt < 20; attempt++) {
    await new Promise((r) => setTimeout(r, attempt === 0 ? 300 : 500))
    client = await run('ib_atomic_lat', [...args, process.env.SOFTROCE_ADDR || '127.0.0.1'], 60_000)
    if (!/Couldn't connect|Unable to init the socket/.test(client.out)) break
  }
  await server
  return parse(client.out)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((e) => { console.error(`bench locks: ${e?.stack ?? e}`); process.exit(1) })
}
