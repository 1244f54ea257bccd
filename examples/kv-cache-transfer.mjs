#!/usr/bin/env node
// A prefill server hands a request's KV cache to a decode server, the way
// disaggregated LLM serving does: the decode side owns a pool of KV blocks,
// tells the prefill side which free blocks to fill, and the prefill side
// WRITEs its (non-contiguous) blocks straight into them with one batched post,
// then rings the decode side with a WRITE_WITH_IMM carrying the request id.
// The decode side's CPU never copies a byte; it checks every block at the end.
//
// Both roles run in this process over rdma_cm, on the address of the device
// (default: $SOFTROCE_ADDR, or the device's RoCE v2 IPv4 address):
//   node examples/kv-cache-transfer.mjs [--blocks 48] [--block-kib 64] [--requests 4]
import { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion } from 'node-ibverbs'

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : fallback
}
const BLOCKS = arg('blocks', 48) // blocks per request
const BLOCK = arg('block-kib', 64) * 1024
const REQUESTS = arg('requests', 4)
const POOL_BLOCKS = 2 * BLOCKS

const device = openDevice(process.env.NODE_IBVERBS_DEVICE || process.env.SOFTROCE_DEVICE || undefined)
const v4 = device.gids(1).find((g) => g.gid.startsWith('::ffff:'))
const host = process.env.SOFTROCE_ADDR || v4?.gid.slice(7)
if (!host) throw new Error(`${device.name} has no IPv4 address for rdma_cm`)
const pd = device.allocPd()

// Deterministic contents for block b of request r, so the decode side can check it.
function fill(bytes, request, block) {
  let x = (request * 7919 + block * 104729) >>> 0
  for (let i = 0; i < bytes.length; i += 4) {
    x = (x * 1664525 + 1013904223) >>> 0
    bytes[i] = x; bytes[i + 1] = x >>> 8; bytes[i + 2] = x >>> 16; bytes[i + 3] = x >>> 24
  }
}

// --- decode server: a pool of KV blocks, filled remotely -----------------------
const pool = pd.allocRegion(POOL_BLOCKS * BLOCK, Access.LocalWrite | Access.RemoteWrite)
const listener = await listen({ host, port: 0, pd })
const decode = (async () => {
  const request = await listener.accept()
  const conn = await request.accept({ privateData: encodeDescriptors([pool.describe()]) })
  let checked = 0
  for (let r = 0; r < REQUESTS; r++) {
    // Pick free blocks (here: a shuffled half of the pool) and tell the prefill side.
    const free = [...Array(POOL_BLOCKS).keys()].sort(() => Math.random() - 0.5).slice(0, BLOCKS)
    const ring = conn.qp.recv([]) // the WRITE_WITH_IMM doorbell consumes a receive
    await conn.sendJson({ request: r, blocks: free })
    const done = await ring
    if (done.immediate !== r) throw new Error(`doorbell for request ${done.immediate}, expected ${r}`)
    const expected = new Uint8Array(BLOCK)
    free.forEach((slot, b) => {
      fill(expected, r, b)
      if (Buffer.compare(pool.bytes.subarray(slot * BLOCK, (slot + 1) * BLOCK), expected) !== 0) {
        throw new Error(`request ${r}: block ${b} in slot ${slot} is wrong`)
      }
      checked++
    })
  }
  return { conn, checked }
})()

// --- prefill server: its KV cache, written into the decode pool ---------------
const cache = pd.allocRegion(BLOCKS * BLOCK, Access.LocalWrite)
// receiveJson: the first block table may arrive before we ask for it.
const conn = await connect({ host, port: listener.address.port, pd, receiveJson: true })
const remotePool = remoteRegion(decodeDescriptors(conn.privateData)[0])
let bytes = 0
let transferMs = 0
let nextTable = conn.receiveJson()
for (let r = 0; r < REQUESTS; r++) {
  const { request, blocks } = await nextTable
  // Post the receive for the next block table before ringing the decode side,
  // which answers the doorbell with it (a SEND needs a receive waiting).
  if (r + 1 < REQUESTS) nextTable = conn.receiveJson()
  for (let b = 0; b < BLOCKS; b++) fill(cache.bytes.subarray(b * BLOCK, (b + 1) * BLOCK), request, b)
  // One native call, one doorbell: every block to its slot, then the notification.
  const t0 = performance.now()
  await conn.qp.postBatch([
    ...blocks.map((slot, b) => ({ op: 'write', local: cache.slice(b * BLOCK, BLOCK), remote: remotePool.slice(slot * BLOCK, BLOCK) })),
    { op: 'write', local: [], remote: remotePool.slice(0, 0), immediate: request },
  ])
  transferMs += performance.now() - t0
  bytes += BLOCKS * BLOCK
  console.log(`request ${request}: ${BLOCKS} blocks of ${BLOCK / 1024} KiB written into decode slots ${blocks.slice(0, 6).join(',')},…`)
}
const seconds = transferMs / 1000
const { conn: decodeConn, checked } = await decode
console.log(`decode side verified ${checked} blocks (${(bytes / 2 ** 20).toFixed(1)} MiB); ` +
  `transfers took ${seconds.toFixed(2)} s: ${(bytes / 2 ** 20 / seconds).toFixed(1)} MiB/s on ${device.name}`)
await conn.disconnect()
decodeConn.close()
listener.close()
device.close()
