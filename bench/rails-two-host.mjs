#!/usr/bin/env node
// The transfer engine over two rails between two machines (the two guests of
// the two-host topology: rxe0 and rxe1 on their own wires), against perftest
// on the same wires in the same round: ib_write_bw on rail 0 alone, on rail 1
// alone, and on both at once (two clients started together: what the two
// wires carry together); then one engine write over rail 0 (devices
// [rxe0]) and one over both rails (devices [rxe0, rxe1]), the same bytes in
// random 64 KiB blocks. Host 0 is the target, host 1 prints the table.
//
//   bash scripts/softroce.sh run --topology two-host -- node bench/rails-two-host.mjs [--rounds 3] [--mib 64] [--qps 2]
//
// --qps: QPs per rail. The written blocks are read back and checked in the
// first round.
import { TransferAgent } from 'node-ibverbs'
import { kvLayout } from '../dist/cli/bench-transfer.js'
import { parse, roceV2Ipv4GidIndex, run } from './perftest.mjs'
import { arg, median, perftestArgs, perftestClient, sleep, twoHostEnv } from './two-host-setup.mjs'

const ROUNDS = Number(arg('rounds', 3))
const MIB = Number(arg('mib', 64))
const QPS = Number(arg('qps', 2))
const SIZE = 65536
const MiB = 1 << 20
const BYTES = MIB * MiB
const TX_DEPTH = 128
const ONE_RAIL_PORT = 7475
const TWO_RAIL_PORT = 7476
const TIMEOUT_MS = 600_000
const env = twoHostEnv('bench/rails-two-host.mjs')
const rail1Device = process.env.SOFTROCE_RAIL1_DEVICE
if (!rail1Device) throw new Error('no second rail here: bench/rails-two-host.mjs needs the two-host topology\'s SOFTROCE_RAIL1_* (scripts/softroce.sh)')
const rails = [
  { env, peer: env.peer, local: env.local },
  { env: { ...env, deviceName: rail1Device, gidIndex: roceV2Ipv4GidIndex(rail1Device) }, peer: process.env.SOFTROCE_RAIL1_PEER_ADDR, local: process.env.SOFTROCE_RAIL1_ADDR },
]
const devices = [env.deviceName, rail1Device]
/** ib_write_bw moving the transfer's bytes in 64 KiB messages, on rail `r`. */
const perftestOn = (r, port) => perftestArgs(rails[r].env, { test: 'write_bw', size: SIZE, iters: BYTES / SIZE, txDepth: TX_DEPTH }, port)
/** Each round's perftest runs: [rails used, port offset] (both: two servers and two clients at once). */
const PERFTEST_RUNS = [[[0], 0], [[1], 1], [[0, 1], 2]]

if (env.host === '0') {
  const one = await TransferAgent.create({ host: env.local, port: ONE_RAIL_PORT, name: 'one-rail-target', device: env.deviceName })
  const two = await TransferAgent.create({ host: env.local, port: TWO_RAIL_PORT, name: 'two-rail-target', devices })
  for (const agent of [one, two]) agent.register('pool', { size: 2 * BYTES, remote: 'read-write' })
  const done = new Promise((resolve) => one.on('notification', ({ message }) => { if (String(message) === 'done') resolve() }))
  let port = 19400
  for (let round = 0; round < ROUNDS; round++) {
    for (const [used] of PERFTEST_RUNS) {
      const servers = await Promise.all(used.map((r, k) => { const [tool, args] = perftestOn(r, port + k); return run(tool, args, TIMEOUT_MS) }))
      for (const s of servers) if (s.code !== 0) console.error(`ib_write_bw server failed:\n${s.out}`)
      port += 2
    }
  }
  let timer
  const timedOut = new Promise((resolve) => { timer = setTimeout(resolve, TIMEOUT_MS, false) })
  const arrived = await Promise.race([done.then(() => true), timedOut])
  clearTimeout(timer)
  if (!arrived) console.error(`target: no 'done' from the initiators within ${TIMEOUT_MS} ms`)
  await sleep(500)
  await Promise.all([one.close(), two.close()])
} else {
  const connectRetrying = async (agent, port) => {
    for (let attempt = 0; ; attempt++) {
      try {
        return await agent.connect({ host: env.peer, port, timeoutMs: 30_000 })
      } catch (error) {
        if (attempt > 240) throw error // the other guest may still be booting
        await sleep(500)
      }
    }
  }
  const cases = []
  for (const [label, options, port] of [['engine, rail 0', { device: env.deviceName }, ONE_RAIL_PORT], ['engine, rails 0+1', { devices }, TWO_RAIL_PORT]]) {
    const agent = await TransferAgent.create({ host: env.local, port: 0, name: `initiator-${port}`, qpsPerPeer: QPS, ...options })
    const kv = agent.register('kv', { size: BYTES })
    const check = agent.register('check', { size: BYTES })
    cases.push({ label, agent, kv, check, peer: await connectRetrying(agent, port), mbps: [], shares: [] })
  }
  const perftest = PERFTEST_RUNS.map(([used]) => ({ label: `ib_write_bw, ${used.length === 2 ? 'rails 0+1 at once' : `rail ${used[0]}`}`, mbps: [] }))
  let port = 19400
  let seed = 1
  for (let round = 0; round < ROUNDS; round++) {
    for (const [i, [used]] of PERFTEST_RUNS.entries()) {
      const clients = await Promise.all(used.map((r, k) => { const [tool, args] = perftestOn(r, port + k); return perftestClient(tool, args, rails[r].peer, TIMEOUT_MS) }))
      port += 2
      const results = clients.map((c) => { const r = parse(c.out); return r && r.mbPerSec > 0 ? r : undefined }) // 0: a client that moved nothing
      if (results.some((r) => !r)) console.error(`ib_write_bw client gave no result:\n${clients.map((c) => c.out).join('\n')}`)
      perftest[i].mbps.push(results.some((r) => !r) ? NaN : results.reduce((sum, r) => sum + r.mbPerSec, 0)) // NaN: this round has no figure
      console.error(`  [r${round + 1}] ${perftest[i].label}: ${results.map((r) => r ? r.mbPerSec.toFixed(1) : 'n/a').join(' + ')} MB/s`)
    }
    for (const c of cases) {
      const layout = kvLayout(BYTES / SIZE, SIZE, seed++)
      for (const o of layout.localOffsets) c.kv.bytes.fill(seed & 0xff, o, o + 7) // marks that differ per round
      const before = c.agent.stats().rails
      const t0 = performance.now()
      await c.agent.write(c.peer, { local: c.kv, remote: 'pool', ...layout, blockSize: SIZE }, { timeoutMs: TIMEOUT_MS })
      const mbps = BYTES / ((performance.now() - t0) / 1000) / MiB
      const after = c.agent.stats().rails
      if (round === 0) {
        await c.agent.read(c.peer, { local: c.check, remote: 'pool', ...layout, blockSize: SIZE }, { timeoutMs: TIMEOUT_MS })
        for (let b = 0; b < layout.localOffsets.length; b++) {
          const l = layout.localOffsets[b]
          if (Buffer.compare(c.kv.bytes.subarray(l, l + SIZE), c.check.bytes.subarray(l, l + SIZE)) !== 0) throw new Error(`${c.label}: written block ${b} did not land`)
        }
      }
      c.mbps.push(mbps)
      if (after.length > 1) c.shares.push((after[1].bytes - before[1].bytes) / BYTES)
      console.error(`  [r${round + 1}] ${c.label}: ${mbps.toFixed(1)} MB/s${after.length > 1 ? `, rail 1 carried ${(100 * c.shares.at(-1)).toFixed(0)}%` : ''}`)
    }
  }
  await cases[0].agent.notify(cases[0].peer, 'done', { timeoutMs: 30_000 })
  await Promise.all(cases.map((c) => c.agent.close()))
  const [rail0, , both] = perftest
  const ratio = (xs, ys) => median(xs.map((x, i) => x / ys[i]))
  const spread = (all) => { const xs = all.filter((x) => !Number.isNaN(x)); return `${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}` }
  console.log(`\nRails across two hosts (two QEMU guests, rxe0 and rxe1 on their own wires), ${MIB} MiB per run in 64 KiB blocks, ${ROUNDS} rounds, medians; engine: ${QPS} QPs per rail; ratio against ib_write_bw (-t ${TX_DEPTH}) of the same rails in the same round\n`)
  console.log('| run | MB/s | spread | ratio |')
  console.log('|---|---:|---|---:|')
  for (const p of perftest) console.log(`| ${p.label} | ${median(p.mbps).toFixed(1)} | ${spread(p.mbps)} | |`)
  console.log(`| ${cases[0].label} | ${median(cases[0].mbps).toFixed(1)} | ${spread(cases[0].mbps)} | ${ratio(cases[0].mbps, rail0.mbps).toFixed(2)} (rail 0) |`)
  console.log(`| ${cases[1].label} (rail 1's share ${(100 * median(cases[1].shares)).toFixed(0)}%) | ${median(cases[1].mbps).toFixed(1)} | ${spread(cases[1].mbps)} | ${ratio(cases[1].mbps, both.mbps).toFixed(2)} (rails 0+1 at once) |`)
}
