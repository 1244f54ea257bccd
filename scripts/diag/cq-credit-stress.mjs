// Repeats rdma/35's "small shared CQ" case: two QPs whose send CQ (16
// entries) is far smaller than their 2 x 200 writes. Prints per round how
// many settled and how; stops at the first round that does not finish.
// node scripts/diag/cq-credit-stress.mjs [rounds] [first wr_id]
import { openDevice, Access } from '../../dist/index.js'
import { allocateWrIds } from '../../dist/pending.js'

const ALL = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic
const rounds = Number(process.argv[2] ?? 30)
// Start the wr_id counter at argv[3] (as after a long-running process).
if (process.argv[3]) allocateWrIds(Number(process.argv[3]))
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
for (let round = 0; round < rounds; round++) {
  const pd = device.allocPd()
  const small = device.createCq({ entries: 16 })
  const big = device.createCq({ entries: 4096 })
  const local = pd.allocRegion(1 << 20, ALL)
  const remote = pd.allocRegion(1 << 20, ALL)
  const make = (cq) => pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 256 })
  const senders = [make(small), make(small)]
  const peers = [make(big), make(big)]
  for (let i = 0; i < 2; i++) {
    await senders[i].connect(peers[i].endpoint())
    await peers[i].connect(senders[i].endpoint())
  }
  const size = 1024
  const writes = []
  const started = Date.now()
  for (let i = 0; i < 200; i++) {
    for (let q = 0; q < 2; q++) {
      const at = (q * 200 + i) * size
      writes.push(senders[q].write(local.slice(at, size), remote.asRemote().slice(at, size), { timeoutMs: 20_000 }))
    }
  }
  let resolved = 0
  const codes = {}
  await Promise.all(writes.map((w) => w.then(() => { resolved++ }, (e) => { codes[e.code] = (codes[e.code] ?? 0) + 1 })))
  const state = `cq pending ${small.pending} credits used ${small.credits.used}/${small.credits.capacity}; qp outstanding ${senders.map((s) => s.outstanding)}`
  console.log(`round ${round}: ${resolved} resolved, ${JSON.stringify(codes)} in ${Date.now() - started} ms; ${state}`)
  pd.close(); small.close(); big.close()
  if (resolved !== 400) process.exit(1)
}
device.close()
