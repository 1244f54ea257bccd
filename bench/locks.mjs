#!/usr/bin/env node
// `npm run bench -- locks`: what a lock table on one-sided atomics
// (lib/locks RemoteLockTable) costs, next to perftest's ib_atomic_lat and
// ib_atomic_bw (CAS) in the same boot, over several rounds (each round runs
// perftest again, so every ratio is against the reference of its own round).
//   - latency, one client in this process, one lock, nothing else running: one
//     CAS round trip (compareAndSwap()), and an uncontended acquire+release
//     (2 CAS, 2 round trips), with an event CQ and with a busy-polled CQ;
//   - throughput with 1, 2, 4, 8 client *processes*, each its own connection:
//     acquire+release pairs per second, each client on its own lock (no
//     contention; atomics/s = 2 per pair, against ib_atomic_bw's message rate);
//   - fairness under contention: the same processes all on one lock, full
//     rounds (acquire, fence + READ, WRITE, release); acquisitions per client,
//     max/min, and the counter checked exactly at the end.
// Options: --seconds S (per point, default 3), --rounds R (default 5),
// --processes 1,2,4,8, --poll event|busy (the client processes' CQs, default event),
// --mode spin|fifo (the tables' mode, default spin),
// --warm-s S (default 10: the in-process latency paths run S seconds before round 1, as the other
// harnesses warm up; 0 measures round 1 cold),
// --dist DIR (another build of the library, e.g. bench/results/variants/NAME/dist
// from bench/icount/snapshot.sh, its addon named by NODE_IBVERBS_ADDON: a before/after in one boot).
//
// `npm run bench -- locks --icount [--n 2000] [--variants DIR,...]`: instructions
// per CAS and per uncontended acquire+release instead, counted by the QEMU
// plugin of bench/icount.mjs in one boot, for the working tree's dist and each
// variant (a directory made by `bash bench/icount/snapshot.sh NAME`).
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const M = 64 // locks in the table
const SHARED = 0 // the contended lock (own locks: 1 + client index)
/** Connection setup's bound: 8 Node processes starting at once in an emulated guest take many seconds. */
const CONNECT_MS = 60_000
/** Atomics of an uncontended acquire + release: two CAS (a --dist build before 2026-12-07 posted a FETCH_ADD too). */
const ATOMICS_PER_PAIR = 2
const ACCESS = (Access) => Access.LocalWrite | Access.RemoteRead | Access.RemoteWrite | Access.RemoteAtomic

/** The library's entry: ../dist, or the build --dist names (passed on to the client processes as LOCKS_BENCH_DIST). */
const entry = () => process.env.LOCKS_BENCH_DIST ? pathToFileURL(resolve(process.env.LOCKS_BENCH_DIST, 'index.js')).href : '../dist/index.js'

function option(argv, name, fallback) {
  const i = argv.indexOf(name)
  return i < 0 ? fallback : argv[i + 1]
}

export async function main(argv) {
  if (argv[0] === '--client') return client(argv.slice(1))
  if (argv[0] === '--guest') return icountGuest(argv.slice(1))
  if (argv[0] === '--icount-paths') return icountPaths(argv.slice(1))
  if (argv.includes('--icount')) return icountHost(argv)
  if (option(argv, '--dist', undefined)) process.env.LOCKS_BENCH_DIST = resolve(option(argv, '--dist', undefined))
  const seconds = Number(option(argv, '--seconds', 3))
  const rounds = Number(option(argv, '--rounds', 5))
  const counts = option(argv, '--processes', '1,2,4,8').split(',').map(Number)
  const poll = option(argv, '--poll', 'event')
  const lockMode = option(argv, '--mode', 'spin')
  const warmS = Number(option(argv, '--warm-s', 10))
  const { listDevices } = await import(entry())
  if (!process.env.SOFTROCE_MODE && listDevices().length === 0) {
    console.error('bench locks: no RDMA device here; running inside the Soft-RoCE environment')
    const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--timeout', '3600', '--', process.execPath, fileURLToPath(import.meta.url), ...argv], { cwd: root, stdio: 'inherit' })
    process.exitCode = await new Promise((r) => child.on('close', r)) ?? 1
    return
  }
  const { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, RemoteLockTable } = await import(entry())
  const { perftest, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const deviceName = process.env.SOFTROCE_DEVICE || process.env.NODE_IBVERBS_DEVICE || listDevices()[0].name
  const gidIndex = roceV2Ipv4GidIndex(deviceName)
  const addr = process.env.SOFTROCE_ADDR || '127.0.0.1'
  const log = (s) => process.stderr.write(s + '\n')

  // The table: M lock words, M counters, M records (fence, counter) in one region of this process.
  const device = openDevice(deviceName)
  const pd = device.allocPd()
  const table = pd.allocRegion(32 * M, ACCESS(Access))
  table.bytes.fill(0)
  const v4 = device.gids(1).find((g) => g.gid.startsWith('::ffff:'))
  const host = process.env.SOFTROCE_ADDR || v4.gid.slice(7)
  const listener = await listen({ host, port: 0, pd })
  const served = []
  void (async () => {
    // Each request accepted without waiting for the one before: 8 client processes start at once in a slow guest.
    for (let r; (r = await listener.accept());) {
      r.accept({ privateData: encodeDescriptors([table.describe()]), timeoutMs: CONNECT_MS }).then((c) => served.push(c), (error) => log(`accept failed: ${error.message}`))
    }
  })()
  const port = listener.address.port

  // In-process clients for the latency rows: one on an event CQ, one on a busy CQ.
  const inProcess = {}
  for (const [mode, owner] of [['event', 101], ['busy', 102]]) {
    const conn = await connect({ host, port, pd, cqOptions: { pollMode: mode } })
    const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
    inProcess[mode] = { conn, remote, locks: new RemoteLockTable(conn.qp, { locks: remote.slice(0, 8 * M), tokens: remote.slice(8 * M, 8 * M), owner, leaseMs: 10_000, mode: lockMode }) }
  }

  // The client processes, started once: each connects and then runs what it is told, a line of JSON at a time.
  const most = Math.max(...counts)
  log(`starting ${most} client processes (--poll ${poll})`)
  const procs = await Promise.all(Array.from({ length: most }, (_, i) => startClient(host, port, i + 1, poll, lockMode)))

  // Warm-up: the latency paths of both in-process clients, for V8 to optimize them before round 1
  // (200 operations per round alone left round 1 cold: CAS 90-114 µs against ~40 µs after).
  for (const mode of ['event', 'busy']) {
    const c = inProcess[mode]
    const word = c.remote.slice(8 * (M - 1), 8)
    for (const end = performance.now() + (warmS * 1000) / 2; performance.now() < end;) {
      await c.conn.qp.compareAndSwap(word, 0n, 0n)
      await c.locks.release(await c.locks.acquire(M - 2))
    }
  }

  const q = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))] }
  const results = []
  for (let round = 1; round <= rounds; round++) {
    // perftest first: the reference of this round. A failed run leaves its cells empty, not the whole benchmark.
    const bw = await perftest({ test: 'atomic_cas_bw', size: 8, iters: 3000, txDepth: 128, device: deviceName, gidIndex, addr })
      .catch((e) => { log(`ib_atomic_bw failed: ${String(e.message).split('\n')[0]}`); return undefined })
    const lat = await atomicLat(deviceName, gidIndex, addr).catch((e) => { log(`ib_atomic_lat failed: ${e.message}`); return undefined })
    const r = { round, atomicLat: lat?.tTypical, atomicBw: bw ? bw.mpps * 1e6 : undefined, latency: {}, procs: [] }
    for (const mode of ['event', 'busy']) {
      const c = inProcess[mode]
      const word = c.remote.slice(8 * (M - 1), 8)
      const cas = [], pairs = []
      for (let i = 0; i < 1200; i++) {
        let t = performance.now()
        await c.conn.qp.compareAndSwap(word, 0n, 0n)
        const tc = (performance.now() - t) * 1000
        t = performance.now()
        await c.locks.release(await c.locks.acquire(M - 2))
        const tp = (performance.now() - t) * 1000
        if (i >= 200) { cas.push(tc); pairs.push(tp) } // the first 200: warm-up
      }
      r.latency[mode] = { cas: q(cas, 0.5), pair: q(pairs, 0.5), pairP99: q(pairs, 0.99) }
    }
    for (const n of counts) {
      const own = await Promise.all(procs.slice(0, n).map((p) => p.ask({ cmd: 'own', seconds })))
      const shared = await Promise.all(procs.slice(0, n).map((p) => p.ask({ cmd: 'shared', seconds })))
      const perClient = shared.map((s) => s.done)
      r.procs.push({ n, pairs: own.reduce((a, s) => a + s.done / s.elapsed, 0), rounds: shared.reduce((a, s) => a + s.done / s.elapsed, 0),
        maxMin: Math.min(...perClient) === 0 ? Infinity : Math.max(...perClient) / Math.min(...perClient), perClient, attemptsMax: Math.max(...shared.map((s) => s.attemptsMax)) })
    }
    results.push(r)
    const l = r.latency
    log(`round ${round}: ib_atomic_lat ${r.atomicLat} µs, ib_atomic_bw ${r.atomicBw} msg/s; CAS event ${l.event.cas.toFixed(1)} busy ${l.busy.cas.toFixed(1)} µs; acquire+release event ${l.event.pair.toFixed(1)} busy ${l.busy.pair.toFixed(1)} µs; ` +
      r.procs.map((p) => `${p.n} procs ${p.pairs.toFixed(0)} pairs/s, shared ${p.rounds.toFixed(0)} rounds/s, per client ${p.perClient.join('/')}`).join('; '))
  }
  // The shared rounds must not have lost an update (the benchmark checks itself).
  const view = new DataView(table.bytes.buffer, table.bytes.byteOffset, table.bytes.byteLength)
  const counted = Number(view.getBigUint64(16 * M + 16 * SHARED + 8, true))
  const expected = results.reduce((s, r) => s + r.procs.reduce((a, p) => a + p.perClient.reduce((x, y) => x + y, 0), 0), 0)
  for (const p of procs) p.child.stdin.end()
  await Promise.all(procs.map((p) => p.exited))

  const f = (x, d = 1) => (x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(d))
  // Median over rounds, and the rounds' min–max.
  const over = (get, d = 2) => {
    const xs = results.map(get).filter((x) => x !== undefined && Number.isFinite(x))
    if (xs.length === 0) return '–'
    return `${f(q(xs, 0.5), d)} (${f(Math.min(...xs), d)}–${f(Math.max(...xs), d)})`
  }
  const ratio = (a, b) => (a === undefined || b === undefined ? undefined : a / b)
  const out = []
  out.push(`Lock table on ${deviceName} (Node ${process.version}, ${new Date().toISOString()}, ${rounds} rounds after ${warmS} s of warm-up, ${seconds} s per point; client processes' CQs: ${poll}; mode: ${lockMode}; library: ${process.env.LOCKS_BENCH_DIST ?? 'dist'})`)
  out.push('Each cell: median over rounds (min–max); every ratio is against perftest in its own round.')
  out.push('')
  out.push('| measure | target | event CQ | busy CQ |')
  out.push('|---|---|---:|---:|')
  out.push(`| \`ib_atomic_lat\` CAS, typical µs | | ${over((r) => r.atomicLat, 1)} | |`)
  out.push(`| CAS round trip (\`compareAndSwap()\`), median µs | | ${over((r) => r.latency.event.cas, 1)} | ${over((r) => r.latency.busy.cas, 1)} |`)
  out.push(`| CAS / \`ib_atomic_lat\` | ≤ 1.5 | ${over((r) => ratio(r.latency.event.cas, r.atomicLat))} | ${over((r) => ratio(r.latency.busy.cas, r.atomicLat))} |`)
  out.push(`| uncontended acquire + release, median µs | | ${over((r) => r.latency.event.pair, 1)} | ${over((r) => r.latency.busy.pair, 1)} |`)
  out.push(`| acquire + release / our CAS | ≤ 2.5 | ${over((r) => ratio(r.latency.event.pair, r.latency.event.cas))} | ${over((r) => ratio(r.latency.busy.pair, r.latency.busy.cas))} |`)
  out.push(`| acquire + release / \`ib_atomic_lat\` | | ${over((r) => ratio(r.latency.event.pair, r.atomicLat))} | ${over((r) => ratio(r.latency.busy.pair, r.atomicLat))} |`)
  out.push(`| acquire + release, p99 µs | | ${over((r) => r.latency.event.pairP99, 0)} | ${over((r) => r.latency.busy.pairP99, 0)} |`)
  out.push('')
  out.push('| client processes | acquire + release/s (own lock each) | atomics/s / `ib_atomic_bw` CAS msg/s | rounds/s, all on 1 lock | acquisitions per client, max/min | most CAS tries of one acquire |')
  out.push('|---:|---:|---:|---:|---:|---:|')
  counts.forEach((n, i) => {
    out.push(`| ${n} | ${over((r) => r.procs[i].pairs, 0)} | ${over((r) => ratio(ATOMICS_PER_PAIR * r.procs[i].pairs, r.atomicBw), 3)} | ${over((r) => r.procs[i].rounds, 0)} | ${over((r) => r.procs[i].maxMin, 2)} | ${over((r) => r.procs[i].attemptsMax, 0)} |`)
  })
  out.push('')
  out.push(`\`ib_atomic_bw\` CAS: ${over((r) => r.atomicBw, 0)} msg/s. Rounds check: ${counted} increments counted on the shared lock's record for ${expected} rounds made${counted === expected ? '' : ' (MISMATCH)'}.`)
  process.stdout.write(out.join('\n') + '\n')
  for (const c of Object.values(inProcess)) await c.conn.disconnect()
  listener.close()
  for (const s of served) s.close()
  device.close()
  if (counted !== expected) process.exitCode = 1
}

/** A client process: `ask(command)` sends a line and resolves with its JSON answer. */
async function startClient(host, port, owner, poll, lockMode) {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--client', host, String(port), String(owner), poll, lockMode], { stdio: ['pipe', 'pipe', 'inherit'] })
  const lines = createInterface({ input: child.stdout })
  const waiting = []
  lines.on('line', (line) => waiting.shift()?.(JSON.parse(line)))
  const exited = new Promise((r) => child.on('exit', r))
  const next = () => new Promise((r) => waiting.push(r))
  await next() // ready
  return { child, exited, ask: (command) => { const answer = next(); child.stdin.write(JSON.stringify(command) + '\n'); return answer } }
}

async function client([host, port, ownerText, poll, lockMode]) {
  const { Access, connect, decodeDescriptors, remoteRegion, RemoteLockTable } = await import(entry())
  const owner = Number(ownerText)
  const conn = await connect({ host, port: Number(port), cqOptions: { pollMode: poll }, timeoutMs: CONNECT_MS })
  const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
  const locks = new RemoteLockTable(conn.qp, { locks: remote.slice(0, 8 * M), tokens: remote.slice(8 * M, 8 * M), owner, leaseMs: 10_000, mode: lockMode })
  const local = conn.pd.allocRegion(8, ACCESS(Access))
  const view = new DataView(local.bytes.buffer, local.bytes.byteOffset, 8)
  const record = 16 * M + 16 * SHARED
  const bodies = {
    own: async () => { await locks.release(await locks.acquire(owner)); return 1 },
    shared: async () => {
      const grant = await locks.acquire(SHARED, { timeoutMs: 60_000 })
      await Promise.all([locks.fence(grant.token, remote.slice(record, 8)), conn.qp.read(local.slice(0, 8), remote.slice(record + 8, 8))])
      view.setBigUint64(0, view.getBigUint64(0, true) + 1n, true)
      await conn.qp.write(local.slice(0, 8), remote.slice(record + 8, 8))
      await locks.release(grant)
      return grant.attempts
    },
  }
  process.stdout.write('{"ready":true}\n')
  for await (const line of createInterface({ input: process.stdin })) {
    const { cmd, seconds } = JSON.parse(line)
    const t0 = performance.now()
    const end = t0 + seconds * 1000
    let done = 0
    let attemptsMax = 0
    while (performance.now() < end) { attemptsMax = Math.max(attemptsMax, await bodies[cmd]()); done++ }
    process.stdout.write(JSON.stringify({ done, elapsed: (performance.now() - t0) / 1000, attemptsMax }) + '\n')
  }
  await conn.disconnect()
}

// --- instruction counts (--icount) -------------------------------------------------

async function icountHost(argv) {
  const { buildTools, qemuWrapper, bootGuest, rows, markdown } = await import('./icount.mjs')
  const { existsSync, mkdirSync, readFileSync } = await import('node:fs')
  buildTools()
  const dir = join(root, 'bench', 'results', `locks-icount-${new Date().toISOString().replace(/[:.]/g, '-')}`)
  mkdirSync(dir, { recursive: true })
  const log = join(dir, 'plugin.log')
  const { code, out } = await bootGuest(fileURLToPath(import.meta.url), argv.filter((a) => a !== '--icount'), qemuWrapper(log, false))
  const labels = out.split('\n').filter((l) => l.startsWith('@icount ')).map((l) => JSON.parse(l.slice(8)))
  const regions = (existsSync(log) ? readFileSync(log, 'utf8') : '').split('\n').filter((l) => l.startsWith('REGION ')).map((line) => {
    const f = line.split(' ')
    const get = (k) => Number(f[f.indexOf(k) + 1])
    return { user: get('user'), kernel: get('kernel') }
  })
  if (labels.length === 0 || labels.length !== regions.length) {
    process.stdout.write(out)
    throw new Error(`${labels.length} labels but ${regions.length} plugin regions (guest exit ${code}); plugin output: ${log}`)
  }
  process.stdout.write(markdown(rows(labels, regions), `${new Date().toISOString().slice(0, 10)}, Node ${process.version}, one boot; lock paths`))
  if (code !== 0) process.exitCode = code
}

/** In the guest: the paths of each build in a process of its own, their @icount lines forwarded in order. */
async function icountGuest(argv) {
  const marker = join(here, 'icount', 'build', 'marker.node')
  const n = option(argv, '--n', '2000')
  const builds = [undefined, ...option(argv, '--variants', '').split(',').filter(Boolean)]
  for (const dir of builds) {
    const variant = dir && resolve(root, dir)
    const args = [fileURLToPath(import.meta.url), '--icount-paths', marker, '--n', n, ...(variant ? ['--dist', join(variant, 'dist'), '--tag', variant.split('/').pop()] : [])]
    const env = variant ? { ...process.env, NODE_IBVERBS_ADDON: join(variant, 'node_ibverbs.node') } : process.env
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'], env })
    const lines = createInterface({ input: child.stdout })
    lines.on('line', (line) => (line.startsWith('@icount ') ? process.stdout : process.stderr).write(line + '\n'))
    const code = await new Promise((r) => child.on('close', r))
    if (code !== 0) throw new Error(`lock paths of ${variant ?? 'dist'} exited with ${code}`)
  }
}

/** One build's lock paths, each warmed up, then run N times between two markers (twice: the host keeps the smaller). */
async function icountPaths(argv) {
  const { createRequire } = await import('node:module')
  const { mark } = createRequire(import.meta.url)(argv[0])
  const n = Number(option(argv, '--n', 2000))
  const tag = option(argv, '--tag', undefined)
  if (option(argv, '--dist', undefined)) process.env.LOCKS_BENCH_DIST = resolve(option(argv, '--dist', undefined))
  const { openDevice, RemoteLockTable } = await import(entry())
  const { connectedPair } = await import('./pair.mjs')
  const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
  const paths = []
  // Held to the end: a pair nothing refers to is collected, and with it the region the atomics target (REM_ACCESS_ERR).
  const pairs = []
  for (const mode of ['busy', 'event']) {
    const { c, s } = await connectedPair(device, mode)
    pairs.push({ c, s })
    const remote = s.mr.asRemote()
    const locks = new RemoteLockTable(c.qp, { locks: remote.slice(0, 64), tokens: remote.slice(64, 64), owner: 1, leaseMs: 60_000 })
    paths.push({ label: `await qp.compareAndSwap() (${mode} CQ)`, f: () => c.qp.compareAndSwap(remote.slice(256, 8), 0n, 0n) })
    paths.push({ label: `lock: uncontended acquire + release (${mode} CQ)`, f: async () => locks.release(await locks.acquire(3)) })
  }
  for (const path of paths) {
    // eslint-disable-next-line no-new-func
    const run = new Function('f', 'n', 'return (async () => { for (let i = 0; i < n; i++) await f() })()').bind(null, path.f)
    await run(n)
    for (const t0 = performance.now(); performance.now() - t0 < 4000;) await run(Math.min(n, 500))
    for (let twice = 0; twice < 2; twice++) {
      const t0 = performance.now()
      mark(1)
      await run(n)
      mark(2)
      const us = ((performance.now() - t0) * 1000) / n
      process.stdout.write('@icount ' + JSON.stringify({ label: tag ? `[${tag}] ${path.label}` : path.label, n, us }) + '\n')
    }
  }
  for (const { c, s } of pairs) for (const side of [c, s]) { side.qp.close(); side.mr.close(); side.cq.close() }
  device.close()
}

/** ib_atomic_lat (CAS), server and client on this device. */
async function atomicLat(device, gidIndex, addr) {
  const { parse, run } = await import('./perftest.mjs')
  const port = String(19515 + Math.floor(Math.random() * 1000))
  const args = ['-A', 'CMP_AND_SWAP', '-d', device, '-x', String(gidIndex), '-F', '-p', port, '-n', '1000']
  const server = run('ib_atomic_lat', args, 60_000)
  let client
  for (let attempt = 0; attempt < 20; attempt++) {
    await new Promise((r) => setTimeout(r, attempt === 0 ? 300 : 500))
    client = await run('ib_atomic_lat', [...args, addr], 60_000)
    if (!/Couldn't connect|Unable to init the socket/.test(client.out)) break
  }
  await server
  return parse(client.out)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((e) => { console.error(`bench locks: ${e?.stack ?? e}`); process.exit(1) })
}
