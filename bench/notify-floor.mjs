// Node's floor under a notified write: the work requests the engine posts
// for one (each block a WRITE, then a SEND_WITH_IMM carrying a short message),
// through the verbs layer alone: one postBatch on an RC QP, the receiver's
// recv() resolving. No planning, no run bookkeeping, no notice ordering: what
// the engine adds is the gap between this and its own row. Both QPs in one
// process, as the engine's latency rows; timed after a warm-up.
//
//   bash scripts/softroce.sh run -- node bench/notify-floor.mjs [--size 4096] [--blocks 1] [--poll busy|event]
// bench/transfer.mjs runs it next to each notified-write case.
import { fileURLToPath } from 'node:url'
import { performance } from 'node:perf_hooks'

export function quantile(sorted, q) { return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] }

/**
 * The work requests the engine posts for a notified write of `blocks` blocks
 * of `blockSize` bytes (a gap after each): a WRITE of each, from `from` in
 * `mr` to `to` in `remote`, then a SEND_WITH_IMM of the 8 bytes at `slot` in
 * `mr` (immediate 1; a caller may change it per post).
 */
export function notifiedBatch(mr, remote, from, to, blocks, blockSize, slot) {
  const batch = Array.from({ length: blocks }, (_, i) => ({ op: 'write', local: mr.slice(from + 2 * i * blockSize, blockSize), remote: remote.slice(to + 2 * i * blockSize, blockSize) }))
  batch.push({ op: 'send', local: mr.slice(slot, 8), immediate: 1 })
  return batch
}

/**
 * Two connected RC QPs on `device` (one process) and the batch the engine
 * posts for a notified write of `blocks` blocks: each a WRITE, then a
 * SEND_WITH_IMM of 8 bytes. `Access` is the library's (icount passes a
 * variant's). bench/icount/node-paths.mjs counts this pair's instructions.
 */
export async function floorPair(device, Access, { size = 4096, blocks = 1, pollMode = 'event' } = {}) {
  const pd = device.allocPd()
  const blockSize = Math.floor(size / blocks)
  const span = 2 * blocks * blockSize // a gap after each block: none merges with the next
  const side = () => {
    const cq = device.createCq({ entries: 1024, pollMode })
    const qp = pd.createQp({ type: 'RC', sendCq: cq, recvCq: cq, maxSendWr: 128, maxRecvWr: 128 })
    const mr = pd.allocRegion(span + 2048, Access.LocalWrite | Access.RemoteWrite)
    return { qp, mr }
  }
  const c = side(), s = side()
  await c.qp.connect(s.qp.endpoint())
  await s.qp.connect(c.qp.endpoint())
  const batch = notifiedBatch(c.mr, s.mr.asRemote(), 0, 0, blocks, blockSize, span)
  return { c, s, batch, inbox: s.mr.slice(span, 1026), lastByte: 2 * (blocks - 1) * blockSize + blockSize - 1 }
}

/** µs from postBatch() until the receiver's recv() resolved (the data is in place then): median and p99. */
export async function notifyFloor({ size = 4096, blocks = 1, pollMode = 'event', iters = 1000, warmupMs = 5000 } = {}) {
  const { openDevice, Access } = await import('../dist/index.js')
  const device = openDevice(process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE)
  try {
    const { c, s, batch, inbox, lastByte } = await floorPair(device, Access, { size, blocks, pollMode })
    let n = 0
    const once = async () => {
      const seq = (n++ % 255) + 1
      c.mr.bytes[lastByte] = seq
      const t0 = performance.now()
      const received = s.qp.recv(inbox)
      const posted = c.qp.postBatch(batch)
      const wc = await received
      const t1 = performance.now()
      await posted
      if (wc.immediate !== 1 || s.mr.bytes[lastByte] !== seq) throw new Error('notify-floor: the receive completed before its data')
      return (t1 - t0) * 1000
    }
    const warmEnd = performance.now() + warmupMs
    while (performance.now() < warmEnd) await once()
    const lat = new Float64Array(iters)
    for (let i = 0; i < iters; i++) lat[i] = await once()
    lat.sort()
    return { kind: 'notify-floor', size, blocks, pollMode, iters, warmupMs, typical: quantile(lat, 0.5), p99: quantile(lat, 0.99) }
  } finally {
    device.close()
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const arg = (name, d) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : d }
  const r = await notifyFloor({ size: Number(arg('--size', 4096)), blocks: Number(arg('--blocks', 1)), pollMode: arg('--poll', 'event'), iters: Number(arg('--iters', 1000)) })
  console.log(`${r.blocks} x ${r.size / r.blocks} B WRITE + SEND_WITH_IMM, one postBatch, ${r.pollMode} CQs: until recv() resolved typical ${r.typical.toFixed(1)} µs, p99 ${r.p99.toFixed(1)} µs`)
}
