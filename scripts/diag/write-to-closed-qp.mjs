// rdma/35's small-shared-CQ case, then again with the responder QPs closed
// before the writes: with retryCount 7 (the default) rxe retries forever (it
// reads 7 as infinite; the IB spec only does so for rnrRetry) and only the
// requests' timeoutMs ends them; with retryCount 6 they fail RETRY_EXC_ERR.
// node scripts/diag/write-to-closed-qp.mjs
import { openDevice, Access } from '../../dist/index.js'
const ALL = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
for (const [closePeers, retryCount] of [[false, 7], [true, 7], [true, 6]]) {
  const pd = device.allocPd()
  const small = device.createCq({ entries: 16 })
  const big = device.createCq({ entries: 4096 })
  const local = pd.allocRegion(1 << 20, ALL)
  const remote = pd.allocRegion(1 << 20, ALL)
  const make = (cq) => pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 256 })
  const senders = [make(small), make(small)]
  const peers = [make(big), make(big)]
  for (let i = 0; i < 2; i++) {
    await senders[i].connect(peers[i].endpoint(), { retryCount })
    await peers[i].connect(senders[i].endpoint())
  }
  if (closePeers) for (const peer of peers) peer.close()
  console.log(`closePeers=${closePeers} retryCount=${retryCount}`)
  const size = 1024
  const writes = []
  const started = Date.now()
  for (let i = 0; i < 200; i++) for (let q = 0; q < 2; q++) {
    const at = (q * 200 + i) * size
    writes.push(senders[q].write(local.slice(at, size), remote.asRemote().slice(at, size), { timeoutMs: 20_000 }))
  }
  let resolved = 0
  const codes = {}
  const t = setInterval(() => console.log(`  ${Date.now() - started} ms: resolved ${resolved} codes ${JSON.stringify(codes)} credits ${small.credits.used}/${small.credits.capacity} outstanding ${senders.map((s) => s.outstanding)} states ${senders.map((s) => s.state)}`), 2000)
  await Promise.all(writes.map((w) => w.then(() => { resolved++ }, (e) => { codes[e.code] = (codes[e.code] ?? 0) + 1 })))
  clearInterval(t)
  console.log(`  done: ${resolved} resolved, ${JSON.stringify(codes)} in ${Date.now() - started} ms`)
  pd.close(); small.close(); big.close()
}
device.close()
