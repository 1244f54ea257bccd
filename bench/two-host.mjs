#!/usr/bin/env node
// The second benchmark table: perftest and node-ibverbs across two machines
// (the two guests of the two-host topology, two kernels, one virtual wire).
//   bash scripts/softroce.sh run --topology two-host -- node bench/two-host.mjs
// Host 0 serves (perftest servers, then an rdma_cm listener with a region);
// host 1 runs perftest's clients and ours against it and prints the table.
import { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion } from 'node-ibverbs'
import { parse, run } from './perftest.mjs'
import { perftestArgs, perftestClient, sleep, twoHostEnv } from './two-host-setup.mjs'

const TIMEOUT_MS = 120_000

const CASES = [
  { test: 'write_bw', size: 65536, iters: 400 },
  { test: 'write_bw', size: 8, iters: 3000 },
  { test: 'read_lat', size: 8, iters: 400 },
]
const TX_DEPTH = 128
const CM_PORT = 7472
const env = twoHostEnv('bench/two-host.mjs')
const { host, peer, local, deviceName } = env

const device = openDevice(deviceName)
const pd = device.allocPd()
const region = pd.allocRegion(1 << 20, Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead)

if (host === '0') {
  for (const [i, c] of CASES.entries()) {
    const [tool, args] = perftestArgs(env, { ...c, txDepth: TX_DEPTH }, 19000 + i)
    const server = await run(tool, args, TIMEOUT_MS)
    if (server.code !== 0) console.error(`${tool} server failed:\n${server.out}`)
  }
  const listener = await listen({ host: local, port: CM_PORT, pd })
  const request = await listener.accept()
  const conn = await request.accept({ privateData: encodeDescriptors([region.describe()]) })
  await new Promise((resolve) => conn.once('disconnected', resolve))
  conn.close()
  listener.close()
} else {
  const rows = []
  for (const [i, c] of CASES.entries()) {
    const [tool, args] = perftestArgs(env, { ...c, txDepth: TX_DEPTH }, 19000 + i)
    const client = await perftestClient(tool, args, peer, TIMEOUT_MS)
    const result = parse(client.out)
    if (!result) throw new Error(`${tool} client gave no result:\n${client.out}`)
    rows.push({ ...c, perftest: result })
  }

  let conn
  for (let attempt = 0; !conn; attempt++) {
    try {
      conn = await connect({ host: peer, port: CM_PORT, pd, qp: { maxSendWr: TX_DEPTH } })
    } catch (error) {
      if (error.code !== 'ECONNREFUSED' || attempt > 60) throw error
      await sleep(500)
    }
  }
  const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
  for (const row of rows) {
    const slice = region.slice(0, row.size)
    const target = remote.slice(0, row.size)
    if (row.test === 'write_bw') {
      // A window of TX_DEPTH outstanding writes, as ib_write_bw keeps.
      let posted = 0
      const t0 = performance.now()
      await new Promise((resolve, reject) => {
        let done = 0
        const next = () => {
          if (posted >= row.iters) return
          posted++
          conn.qp.write(slice, target).then(() => { if (++done === row.iters) resolve(); else next() }, reject)
        }
        for (let k = 0; k < TX_DEPTH; k++) next()
      })
      const seconds = (performance.now() - t0) / 1000
      row.ours = { mbps: (row.iters * row.size) / seconds / (1 << 20) }
      row.ratio = row.ours.mbps / row.perftest.mbPerSec
    } else {
      const samples = []
      for (let k = 0; k < row.iters; k++) {
        const t0 = performance.now()
        await conn.qp.read(slice, target)
        samples.push((performance.now() - t0) * 1000)
      }
      samples.sort((a, b) => a - b)
      row.ours = { typical: samples[samples.length >> 1] }
      row.ratio = row.ours.typical / row.perftest.tTypical
    }
  }
  await conn.disconnect()
  console.log('\nTwo hosts (two QEMU guests, rxe0 on each, virtual wire): ours / perftest\n')
  console.log('| test | size | perftest | ours | ratio |')
  console.log('|---|---:|---:|---:|---:|')
  for (const r of rows) {
    const bw = r.test.endsWith('_bw')
    const theirs = bw ? `${r.perftest.mbPerSec.toFixed(2)} MB/s` : `${r.perftest.tTypical.toFixed(1)} µs typ`
    const ours = bw ? `${r.ours.mbps.toFixed(2)} MB/s` : `${r.ours.typical.toFixed(1)} µs typ`
    console.log(`| ${r.test} | ${r.size} B | ${theirs} | ${ours} | ${r.ratio.toFixed(2)} |`)
  }
}
device.close()
