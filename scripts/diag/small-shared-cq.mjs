// rdma/35's small-shared-CQ setup for the diagnosis scripts: two sender QPs
// whose send CQ (16 entries) is far smaller than their 2 x 200 writes of
// 1 KiB, each connected to a responder QP on a big CQ.
import { Access } from '../../dist/index.js'

const ALL = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic
const SIZE = 1024
const PER_QP = 200

/** The two pairs on a PD of their own; `connect` options apply to the senders. close() frees everything. */
export async function smallSharedCq(device, connect = {}) {
  const pd = device.allocPd()
  const small = device.createCq({ entries: 16 })
  const big = device.createCq({ entries: 4096 })
  const local = pd.allocRegion(1 << 20, ALL)
  const remote = pd.allocRegion(1 << 20, ALL)
  const make = (cq) => pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 256 })
  const senders = [make(small), make(small)]
  const peers = [make(big), make(big)]
  for (let i = 0; i < 2; i++) {
    await senders[i].connect(peers[i].endpoint(), connect)
    await peers[i].connect(senders[i].endpoint())
  }
  return { small, senders, peers, close: () => { pd.close(); small.close(); big.close() }, local, remote }
}

/**
 * Posts the 400 writes (each with a 20 s timeoutMs) and counts how they
 * settle; `resolved` and `codes` are live while they run.
 */
export function writeAll({ senders, local, remote }) {
  const tally = { resolved: 0, codes: {}, started: Date.now(), total: 2 * PER_QP }
  const writes = []
  for (let i = 0; i < PER_QP; i++) {
    for (let q = 0; q < 2; q++) {
      const at = (q * PER_QP + i) * SIZE
      writes.push(senders[q].write(local.slice(at, SIZE), remote.asRemote().slice(at, SIZE), { timeoutMs: 20_000 })
        .then(() => { tally.resolved++ }, (e) => { tally.codes[e.code] = (tally.codes[e.code] ?? 0) + 1 }))
    }
  }
  return { tally, settled: Promise.all(writes) }
}
