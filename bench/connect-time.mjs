#!/usr/bin/env node
// Connection setup time with rdma_cm, ours against librdmacm's own programs,
// in the same environment: run inside it (bash scripts/softroce.sh run -- node bench/connect-time.mjs).
// Ours: N sequential connect()+disconnect() to an in-process listener (median).
// C: rdma_client against rdma_server (one process each per connection; the
// time of rdma_client's whole run, which includes its process start), and
// rping -C 1 the same way.
import { execFileSync, spawn } from 'node:child_process'
import { connect, listen, openDevice } from 'node-ibverbs'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const rounds = Number(process.argv[2] ?? 20)
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6

const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const pd = device.allocPd()
const listener = await listen({ host, port: 0, pd })
listener.on('request', (request) => request.accept().then((conn) => conn.on('disconnected', () => conn.close())).catch(() => {}))
const ours = []
const oursDisconnect = []
for (let i = 0; i < rounds; i++) {
  const t0 = process.hrtime.bigint()
  const conn = await connect({ host, port: listener.address.port, pd })
  ours.push(ms(t0))
  const t1 = process.hrtime.bigint()
  await conn.disconnect()
  oursDisconnect.push(ms(t1))
}
listener.close()
device.close()

async function cPair(server, client, n) {
  const times = []
  for (let i = 0; i < n; i++) {
    const port = String(20000 + i)
    const srv = spawn(server[0], server[1](port), { stdio: 'ignore' })
    await new Promise((r) => setTimeout(r, 300)) // let it listen
    const t0 = process.hrtime.bigint()
    try {
      execFileSync(client[0], client[1](port), { stdio: 'ignore', timeout: 20_000 })
      times.push(ms(t0))
    } catch { /* counted as missing */ }
    srv.kill('SIGKILL')
  }
  return times
}
const cm = await cPair(['rdma_server', (p) => ['-p', p]], ['rdma_client', (p) => ['-s', host, '-p', p]], Math.min(rounds, 10))
const rping = await cPair(['rping', (p) => ['-s', '-a', host, '-p', p, '-C', '1']], ['rping', (p) => ['-c', '-a', host, '-p', p, '-C', '1']], Math.min(rounds, 10))

console.log('| what | median ms | runs |')
console.log('|---|---:|---:|')
console.log(`| node-ibverbs connect() (resolve addr + route, QP, connect) | ${median(ours).toFixed(1)} | ${ours.length} |`)
console.log(`| node-ibverbs disconnect() | ${median(oursDisconnect).toFixed(1)} | ${oursDisconnect.length} |`)
console.log(`| rdma_client whole run (process start, connect, 16 B echo, disconnect) | ${cm.length ? median(cm).toFixed(1) : 'n/a'} | ${cm.length} |`)
console.log(`| rping -c -C 1 whole run | ${rping.length ? median(rping).toFixed(1) : 'n/a'} | ${rping.length} |`)
