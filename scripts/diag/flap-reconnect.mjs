// After a link flap, does rdma_cm reach the other host again, and when?
// The fault campaign saw a reconnect fail with UNREACHABLE (status -110) after
// a second flap, and connects between the hosts time out for 30 s and more,
// while a reconnect after the first flap worked. Two-host topology:
//   bash scripts/softroce.sh run --topology two-host -- node scripts/diag/flap-reconnect.mjs [flaps] [downMs] [close-while-down|close-after-up|qp-while-down]
// Host 0 accepts every connection for the run; host 1 connects, then per flap:
// link down for downMs, up, and a connect attempt every second until one
// works (at most 90 s), printing each outcome, rxe's GIDs and the neighbour entry.
import { execFileSync } from 'node:child_process'
import { connect, listen, openDevice } from '../../dist/index.js'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peer = process.env.SOFTROCE_PEER_ADDR
const netdev = process.env.SOFTROCE_NETDEV || 'eth0'
const PORT = 7495
const flaps = Number(process.argv[2] ?? 3)
const downMs = Number(process.argv[3] ?? 3000)
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const pd = device.allocPd()
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const sh = (cmd, args) => { try { return execFileSync(cmd, args, { encoding: 'utf8', timeout: 10_000 }).trim() } catch (e) { return `(${e.message.split('\n')[0]})` } }
const t0 = performance.now()
// The longest the event loop went without running a 50 ms timer (a blocked thread shows here).
let lastTick = performance.now()
let maxGap = 0
setInterval(() => { const now = performance.now(); maxGap = Math.max(maxGap, now - lastTick - 50); lastTick = now }, 50).unref()
const gap = () => { const g = maxGap; maxGap = 0; return `${Math.round(g)} ms` }
const at = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`

if (role === '0') {
  const listener = await listen({ host: local, port: PORT, pd })
  let accepted = 0
  listener.on('request', (request) => request.accept({ timeoutMs: 10_000 }).then((conn) => { accepted++; conn.on('disconnected', () => conn.close()) }, (e) => console.log(`${at()} accept failed: ${e.code}`)))
  await sleep(60_000 + flaps * 120_000)
  console.log(`host 0: accepted ${accepted} connections`)
  listener.close()
} else {
  const events = []
  device.on('async', (e) => events.push(`${at()} ${e.type}`))
  const attempt = async () => {
    try {
      const conn = await connect({ host: peer, port: PORT, pd, timeoutMs: 5000 })
      await conn.disconnect()
      return 'connected'
    } catch (e) {
      return `${e.code}: ${e.message}`
    }
  }
  for (let i = 0; i < 60; i++) { if ((await attempt()) === 'connected') break; await sleep(1000) } // host 0 may still be starting
  console.log(`${at()} connected before any flap; QP1: ${sh('rdma', ['res', 'show', 'qp', 'lqpn', '1'])}`)
  const mode = process.argv[4] // close-while-down | close-after-up | qp-while-down
  for (let flap = 1; flap <= flaps; flap++) {
    // A connection established before the flap: closed while the link is down, once it is up, or its QP while down and the rest once up.
    const held = mode ? await connect({ host: peer, port: PORT, pd, timeoutMs: 5000 }) : undefined
    sh('ip', ['link', 'set', netdev, 'down'])
    if (held && mode === 'qp-while-down') { await sleep(300); held.qp.close(); console.log(`${at()} flap ${flap}: closed the connection's QP while the link was down`) }
    if (held && mode === 'close-while-down') { await sleep(300); held.close(); console.log(`${at()} flap ${flap}: closed a connection while the link was down`) }
    await sleep(downMs)
    sh('ip', ['link', 'set', netdev, 'up'])
    if (held && mode === 'qp-while-down') { await sleep(1000); held.close(); console.log(`${at()} flap ${flap}: closed the rest (the rdma_cm id) 1 s after the link came up`) }
    if (held && mode === 'close-after-up') { await sleep(1000); held.close(); console.log(`${at()} flap ${flap}: closed the connection 1 s after the link came up`) }
    console.log(`${at()} flap ${flap}: link up again; events so far: ${events.splice(0).join(', ')}`)
    let ok = false
    for (let n = 1; n <= 90 && !ok; n++) {
      const outcome = await attempt()
      ok = outcome === 'connected'
      if (ok || n === 1 || n % 10 === 0) console.log(`${at()} flap ${flap}, attempt ${n}: ${outcome}`)
      if (n === 1 || n === 10) console.log(`  neigh: ${sh('ip', ['neigh', 'show', 'dev', netdev])} | gids: ${JSON.stringify(device.gids(1))}\n  QP1: ${sh('rdma', ['res', 'show', 'qp', 'lqpn', '1'])}\n  stats: ${sh('rdma', ['statistic', 'show'])}`)
      if (!ok) await sleep(1000)
    }
    console.log(`${at()} flap ${flap}: ${ok ? 'reconnected' : 'NOT reconnected within 90 attempts'}; longest event-loop stall ${gap()}`)
  }
}
device.close()
process.exit(0)
