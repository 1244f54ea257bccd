#!/usr/bin/env node
// The transfer engine across two machines (the two guests of the two-host
// topology: two kernels, one virtual wire), against perftest across the same
// wire, interleaved per round. Host 0 is the target (perftest servers and an
// agent with a 'pool' to write into and a 'source' to read from); host 1 runs
// perftest's clients and the initiating agents and prints the table.
//
//   bash scripts/softroce.sh run --topology two-host -- node bench/transfer-two-host.mjs [--rounds 3] [--mib 64] [--qps 1,4]
//
// Writes go into random slots of host 0's pool (checked by reading them back,
// in the first round); reads come from random slots of a source whose bytes
// both sides can compute (checked every time).
import { TransferAgent } from 'node-ibverbs'
import { kvLayout } from '../dist/cli/bench-transfer.js'
import { parse, run } from './perftest.mjs'
import { arg, median, perftestArgs, perftestClient, sleep, twoHostEnv } from './two-host-setup.mjs'

const ROUNDS = Number(arg('rounds', 3))
const MIB = Number(arg('mib', 64))
const QPS = arg('qps', '1,4').split(',').map(Number)
const CASES = [
  { op: 'write', size: 65536 },
  { op: 'write', size: 16384 },
  { op: 'write', size: 4096 },
  { op: 'read', size: 16384 },
]
const MiB = 1 << 20
const BYTES = MIB * MiB
const TX_DEPTH = 128
const AGENT_PORT = 7473
const TIMEOUT_MS = 600_000
const env = twoHostEnv('bench/transfer-two-host.mjs')
const { host, peer: peerAddr, local, deviceName } = env

/** The source segment's bytes: a function of the offset both hosts can compute (period: a prime above 64 KiB). */
const PERIOD = 65521
function sourceByte(offset) {
  return (((offset % PERIOD) * 2654435761) >>> 24) & 0xff
}

/** ib_write_bw (ib_read_bw) moving the same bytes as one transfer, in blocks of the case's size. */
function perftestFor(c, port) {
  return perftestArgs(env, { test: c.op === 'write' ? 'write_bw' : 'read_bw', size: c.size, iters: BYTES / c.size, txDepth: TX_DEPTH }, port)
}

if (host === '0') {
  const agent = await TransferAgent.create({ host: local, port: AGENT_PORT, name: 'target', device: deviceName })
  agent.register('pool', { size: 2 * BYTES, remote: 'read-write' })
  const source = agent.register('source', { size: 2 * BYTES, remote: 'read' })
  for (let i = 0; i < PERIOD; i++) source.bytes[i] = sourceByte(i)
  for (let n = PERIOD; n < source.length; n *= 2) source.bytes.copyWithin(n, 0, Math.min(n, source.length - n))
  const done = new Promise((resolve) => agent.on('notification', ({ message }) => { if (String(message) === 'done') resolve() }))
  let port = 19300
  for (let round = 0; round < ROUNDS; round++) {
    for (const c of CASES) {
      const [tool, args] = perftestFor(c, port++)
      const server = await run(tool, args, TIMEOUT_MS)
      if (server.code !== 0) console.error(`${tool} server failed:\n${server.out}`)
    }
  }
  // The bound's timer is cleared once 'done' wins: left pending, it kept this process alive for
  // 600 s after the agent closed, and host 0 looked as if it had never received 'done'.
  let timer
  const timedOut = new Promise((resolve) => { timer = setTimeout(resolve, TIMEOUT_MS, false) })
  const arrived = await Promise.race([done.then(() => true), timedOut])
  clearTimeout(timer)
  if (!arrived) console.error(`target: no 'done' from the initiators within ${TIMEOUT_MS} ms`)
  await sleep(500) // let the initiators close first
  agent.close()
} else {
  const initiators = new Map()
  for (const qps of QPS) {
    const agent = await TransferAgent.create({ host: local, port: 0, name: `initiator-${qps}`, qpsPerPeer: qps, device: deviceName })
    const kv = agent.register('kv', { size: BYTES })
    const check = agent.register('check', { size: BYTES })
    let peer
    for (let attempt = 0; !peer; attempt++) {
      try {
        peer = await agent.connect({ host: peerAddr, port: AGENT_PORT, timeoutMs: 30_000 })
      } catch (error) {
        if (attempt > 240) throw error // the other guest may still be booting
        await sleep(500)
      }
    }
    initiators.set(qps, { agent, kv, check, peer })
  }
  const rows = new Map()
  let port = 19300
  let seed = 1
  for (let round = 0; round < ROUNDS; round++) {
    for (const c of CASES) {
      const [tool, args] = perftestFor(c, port++)
      const client = await perftestClient(tool, args, peerAddr, TIMEOUT_MS)
      const pt = parse(client.out)
      if (!pt) console.error(`${tool} client gave no result:\n${client.out}`)
      for (const qps of QPS) {
        const { agent, kv, check, peer } = initiators.get(qps)
        const key = `${c.op}|${c.size}|${qps}`
        if (!rows.has(key)) rows.set(key, { ...c, qps, perftest: [], ours: [], ratios: [] })
        const row = rows.get(key)
        const blocks = BYTES / c.size
        const layout = kvLayout(blocks, c.size, seed++)
        if (c.op === 'write') for (const o of layout.localOffsets) kv.bytes.fill(seed & 0xff, o, o + 7) // marks that differ per case
        const t0 = performance.now()
        const remote = c.op === 'write' ? 'pool' : 'source'
        const r = await agent[c.op](peer, { local: kv, remote, ...layout, blockSize: c.size }, { timeoutMs: TIMEOUT_MS })
        const mbps = BYTES / ((performance.now() - t0) / 1000) / MiB
        // Check every block: reads against the source's known bytes; writes by reading them back (first round).
        if (c.op === 'read') {
          for (let i = 0; i < blocks; i++) {
            const l = layout.localOffsets[i], s = layout.remoteOffsets[i]
            for (let k = 0; k < c.size; k += 509) if (kv.bytes[l + k] !== sourceByte(s + k)) throw new Error(`read block ${i} byte ${k} is wrong`)
          }
        } else if (round === 0) {
          await agent.read(peer, { local: check, remote: 'pool', ...layout, blockSize: c.size }, { timeoutMs: TIMEOUT_MS })
          for (let i = 0; i < blocks; i++) {
            const l = layout.localOffsets[i]
            if (Buffer.compare(kv.bytes.subarray(l, l + c.size), check.bytes.subarray(l, l + c.size)) !== 0) throw new Error(`written block ${i} did not land`)
          }
        }
        row.ours.push(mbps)
        if (pt) { row.perftest.push(pt.mbPerSec); row.ratios.push(mbps / pt.mbPerSec) }
        console.error(`  [r${round + 1}] ${c.op} ${blocks} x ${c.size / 1024} KiB qps ${qps}: ours ${mbps.toFixed(2)} MB/s (${r.workRequests} WRs) | ${tool} ${pt ? pt.mbPerSec.toFixed(2) : 'n/a'} MB/s`)
      }
    }
  }
  await initiators.get(QPS[0]).agent.notify(initiators.get(QPS[0]).peer, 'done', { timeoutMs: 30_000 })
  for (const { agent } of initiators.values()) agent.close()
  console.log(`\nTransfer engine across two hosts (two QEMU guests, rxe0 on each, virtual wire), ${MIB} MiB per transfer, ${ROUNDS} rounds; ratio = ours / perftest (1 QP, -t ${TX_DEPTH}) in the same round, median [min–max]\n`)
  console.log('| op | blocks | qps | perftest MB/s | ours MB/s | ratio | spread |')
  console.log('|---|---|---:|---:|---:|---:|---|')
  for (const r of rows.values()) {
    console.log(`| ${r.op} | ${BYTES / r.size} x ${r.size / 1024} KiB | ${r.qps} | ${median(r.perftest).toFixed(2)} | ${median(r.ours).toFixed(2)} | ${median(r.ratios).toFixed(2)} | ${Math.min(...r.ratios).toFixed(2)}–${Math.max(...r.ratios).toFixed(2)} |`)
  }
}
