// Does connect() resolve the peer's address when the neighbour table was just
// emptied (as a link flap empties it)? Linux 6.1's rdma_resolve_ip can miss an
// ARP answer that arrives before it queues its request, and then waits out its
// whole timeout (lib/cm/connection.ts, resolveAddress). Two-host topology:
//   bash scripts/softroce.sh run --topology two-host -- node scripts/diag/resolve-after-neigh-flush.mjs [rounds] [DIST,...]
// Host 0 accepts every connection; host 1, for each library build in DIST
// (default ../../dist) and each round: flushes its neighbour table, connects
// with timeoutMs 5000, disconnects. Prints each build's outcomes and times.
import { execFileSync } from 'node:child_process'
import { resolve } from 'node:path'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peer = process.env.SOFTROCE_PEER_ADDR
const netdev = process.env.SOFTROCE_NETDEV || 'eth0'
const PORT = 7496
const rounds = Number(process.argv[2] ?? 20)
const dists = (process.argv[3] ?? new URL('../../dist', import.meta.url).pathname).split(',')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

if (role === '0') {
  const { listen, openDevice } = await import(resolve(dists[0], 'index.js'))
  const pd = openDevice(process.env.SOFTROCE_DEVICE || undefined).allocPd()
  const listener = await listen({ host: local, port: PORT, pd })
  let last = 0 // when the last request came: host 0 stops 20 s after host 1's last one
  listener.on('request', (request) => {
    last = performance.now()
    request.accept({ timeoutMs: 10_000 }).then((conn) => conn.on('disconnected', () => conn.close()), () => {})
  })
  const cap = performance.now() + 120_000 + dists.length * rounds * 7_000
  while (performance.now() < cap && (last === 0 || performance.now() - last < 20_000)) await sleep(1000)
  listener.close()
} else {
  await sleep(5000) // host 0 starts listening
  for (const dist of dists) {
    const { connect, openDevice } = await import(resolve(dist, 'index.js'))
    const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
    const pd = device.allocPd()
    const outcomes = []
    for (let i = 0; i < rounds; i++) {
      execFileSync('ip', ['neigh', 'flush', 'dev', netdev])
      const start = performance.now()
      try {
        const conn = await connect({ host: peer, port: PORT, pd, timeoutMs: 5000 })
        outcomes.push(`ok ${Math.round(performance.now() - start)} ms`)
        await conn.disconnect()
      } catch (e) {
        outcomes.push(`${e.code} ${Math.round(performance.now() - start)} ms`)
      }
    }
    const failed = outcomes.filter((o) => !o.startsWith('ok')).length
    console.log(`${dist}: ${rounds - failed} of ${rounds} connected after a neighbour flush; ${outcomes.join(', ')}`)
    pd.close()
    device.close()
  }
}
process.exit(0)
