// The transfer engine under a link flap across two hosts, the case the fault
// campaign saw fail: host 1 takes its link down for 3 s in the middle of a
// write; then it tries a small write every 2 s (each reconnects if the link
// is broken) for up to 120 s, printing each outcome and host 0's agent events.
//   bash scripts/softroce.sh run --topology two-host -- node scripts/diag/transfer-flap.mjs [close-stale]
// (close-stale: host 0 closes its link to host 1 at the first failed handshake: does the next one work?)
import { execFileSync } from 'node:child_process'
import { TransferAgent } from '../../dist/index.js'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peerAddr = process.env.SOFTROCE_PEER_ADDR
const netdev = process.env.SOFTROCE_NETDEV || 'eth0'
const PORT = 7486
const MiB = 1 << 20
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const t0 = performance.now()
const at = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`
const agent = await TransferAgent.create({ host: local, port: role === '0' ? PORT : 0, name: `flap-${role}`, qpsPerPeer: 2, ackTimeout: 14 })
const segment = agent.register('kv', { size: 8 * MiB, remote: role === '0' ? 'read-write' : 'none' })
for (const event of ['peer', 'peerLost', 'handshakeError']) agent.on(event, (e) => console.log(`${at()} ${event}: ${e?.error?.code ?? e?.code ?? e?.name ?? ''}`))
if (role === '0') {
  // With an argument 'close-stale': host 0 drops its links to host 1 at the first failed handshake.
  if (process.argv[2] === 'close-stale') {
    agent.once('handshakeError', () => {
      for (const peer of agent.peers.values()) { console.log(`${at()} closing the stale link to ${peer.name} (${peer.state})`); agent.closePeer(peer) }
    })
  }
  await sleep(200_000)
} else {
  let peer
  for (let i = 0; !peer; i++) { try { peer = await agent.connect({ host: peerAddr, port: PORT, timeoutMs: 10_000 }) } catch (e) { if (i > 60) throw e; await sleep(1000) } }
  segment.bytes.fill(7, 0, 4 * MiB)
  const blocks = Array.from({ length: 64 }, (_, i) => ({ local: [segment, i * 65536], remote: ['kv', (63 - i) * 65536], length: 65536 }))
  const first = agent.write(peer, blocks, { notify: 'first', timeoutMs: 60_000 }).then(() => 'resolved', (e) => `${e.code} (${e.bytesLanded} bytes landed)`)
  await sleep(200)
  execFileSync('ip', ['link', 'set', netdev, 'down'])
  console.log(`${at()} link down`)
  await sleep(3000)
  execFileSync('ip', ['link', 'set', netdev, 'up'])
  console.log(`${at()} link up`)
  console.log(`${at()} the write the flap hit: ${await first}`)
  for (let n = 1; n <= 60; n++) {
    const outcome = await agent.write(peer, [{ local: [segment, 0], remote: ['kv', 0], length: 4096 }], { timeoutMs: 10_000 }).then(() => 'resolved', (e) => `${e.code}: ${e.message.slice(0, 120)}`)
    console.log(`${at()} write ${n}: ${outcome}`)
    if (outcome === 'resolved') break
    await sleep(2000)
  }
}
agent.close()
process.exit(0)
