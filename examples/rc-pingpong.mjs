#!/usr/bin/env node
// A node-ibverbs twin of rdma-core's `ibv_rc_pingpong` that interoperates
// with it in either role: the same TCP exchange of "LID:QPN:PSN:GID", the same
// RC SEND/RECV ping-pong, and the same summary lines.
//
//   server: node examples/rc-pingpong.mjs --server [--port 18515] ...
//   client: node examples/rc-pingpong.mjs [--host] 127.0.0.1 [--port 18515] ...
//   against: ibv_rc_pingpong -d rxe0 -g 1 [host]
//
// The protocol of ibv_rc_pingpong (rdma-core libibverbs/examples/rc_pingpong.c):
// - Each side creates an RC QP (max_send_wr 1, max_recv_wr = rx depth) and
//   posts rx-depth receives of `size` bytes before anything else.
// - TCP, one message each way, each written with a single write():
//   "%04x:%06x:%06x:%s\0" = LID:QPN:PSN:GID, 52 bytes with the trailing NUL.
//   The GID is 32 hex digits: the 16 raw GID bytes in network order. An
//   all-zero GID (no -g) means "no GRH", which RoCE cannot route.
//   client: connects, writes its address, reads the server's, writes "done\0"
//   (5 bytes) and only then moves its QP to RTR/RTS.
//   server: accepts one connection, reads the client's address, moves its QP
//   to RTR/RTS, writes its own address and reads "done".
// - Traffic: the client sends first. Each side posts the next SEND only when
//   both its previous SEND and the peer's next message have completed; the
//   server answers each received message. `iters` messages go each way.
//   The receive queue is refilled to rx depth when at most 1 receive is left.
// - Both print "<bytes> bytes in <s> seconds = <x> Mbit/sec" (bytes =
//   size * iters * 2) and "<iters> iters in <s> seconds = <y> usec/iter",
//   timed from just before the first send.
// - Path MTU defaults to 1024 (-m); the GID index must be the same kind on
//   both sides (the RoCE v2 IPv4 GID: index 1 on the Soft-RoCE guest).
import net from 'node:net'
import { performance } from 'node:perf_hooks'
import { exampleArgs } from './cli-args.mjs'
import { Access, openDevice } from 'node-ibverbs'

const usage = `usage: rc-pingpong.mjs [--server] [--host H | H] [--port 18515] [--size 4096] [--iters 1000]
       [--rx-depth 500] [--mtu 1024] [--gid-index N] [--device NAME] [--ib-port 1] [--timeout-ms 60000]`

const { values: v, positionals, int } = exampleArgs(usage, {
  server: { type: 'boolean', default: false },
  host: { type: 'string' },
  port: { type: 'string', short: 'p', default: '18515' },
  size: { type: 'string', short: 's', default: '4096' },
  iters: { type: 'string', short: 'n', default: '1000' },
  'rx-depth': { type: 'string', short: 'r', default: '500' },
  mtu: { type: 'string', short: 'm', default: '1024' },
  'gid-index': { type: 'string', short: 'g' },
  device: { type: 'string', short: 'd' },
  'ib-port': { type: 'string', short: 'i', default: '1' },
  'timeout-ms': { type: 'string', default: '60000' },
}, { allowPositionals: true })
const port = int('port', 1, 65535)
const size = int('size', 1, 1 << 30)
const iters = int('iters', 1, 2 ** 31 - 1)
const rxDepth = int('rx-depth', 2, 1 << 16)
const mtu = int('mtu', 256, 4096)
const ibPort = int('ib-port', 1, 255)
const timeoutMs = int('timeout-ms', 1, 2 ** 31 - 1)
if (![256, 512, 1024, 2048, 4096].includes(mtu)) {
  console.error(`--mtu must be 256, 512, 1024, 2048 or 4096\n${usage}`)
  process.exit(2)
}
if (positionals.length > 1 || (v.server && (positionals.length || v.host))) {
  console.error(usage)
  process.exit(2)
}
const server = v.server
const host = v.host ?? positionals[0] ?? '127.0.0.1'

// --- wire format ---------------------------------------------------------------

const MSG_BYTES = 52 // sizeof "0000:000000:000000:00000000000000000000000000000000"
const DONE = Buffer.from('done\0')

/** IPv6 text (as device.gids() reports it) -> 16 bytes. */
function gidBytes(text) {
  let s = text
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s)
  if (v4) {
    const [a, b, c, d] = v4.slice(1).map(Number)
    s = s.slice(0, v4.index) + ((a << 8) | b).toString(16) + ':' + ((c << 8) | d).toString(16)
  }
  const [head, tail] = s.includes('::') ? s.split('::') : [s, undefined]
  const words = (part) => (part ? part.split(':').map((w) => parseInt(w, 16)) : [])
  const h = words(head)
  const t = words(tail)
  const all = tail === undefined ? h : [...h, ...new Array(8 - h.length - t.length).fill(0), ...t]
  if (all.length !== 8 || all.some((w) => !(w >= 0 && w <= 0xffff))) throw new Error(`bad GID ${text}`)
  const out = Buffer.alloc(16)
  all.forEach((w, i) => out.writeUInt16BE(w, i * 2))
  return out
}

/** 16 bytes -> the full IPv6 form, which qp.connect() (inet_pton) accepts. */
const gidText = (bytes) => Array.from({ length: 8 }, (_, i) => bytes.readUInt16BE(i * 2).toString(16)).join(':')
/** Short form for printing, like inet_ntop: the longest run of zero words as '::', IPv4-mapped as dotted. */
function gidPretty(bytes) {
  if (bytes.subarray(0, 10).every((b) => b === 0) && bytes.readUInt16BE(10) === 0xffff) return `::ffff:${bytes.subarray(12).join('.')}`
  const words = Array.from({ length: 8 }, (_, i) => bytes.readUInt16BE(i * 2))
  let best = [-1, 0]
  for (let i = 0; i < 8; i++) {
    let j = i
    while (j < 8 && words[j] === 0) j++
    if (j - i > best[1] && j - i > 1) best = [i, j - i]
    i = Math.max(i, j)
  }
  const hex = (ws) => ws.map((w) => w.toString(16)).join(':')
  return best[0] < 0 ? hex(words) : `${hex(words.slice(0, best[0]))}::${hex(words.slice(best[0] + best[1]))}`
}

function encodeDest(d) {
  const hex = (n, w) => n.toString(16).padStart(w, '0')
  const text = `${hex(d.lid, 4)}:${hex(d.qpn, 6)}:${hex(d.psn, 6)}:${d.gid.toString('hex')}\0`
  if (text.length !== MSG_BYTES) throw new Error(`internal: address message is ${text.length} bytes`)
  return Buffer.from(text, 'latin1')
}

function decodeDest(buf) {
  const m = /^([0-9a-f]+):([0-9a-f]+):([0-9a-f]+):([0-9a-f]{32})\0/i.exec(buf.toString('latin1'))
  if (!m) throw new Error(`malformed peer address ${JSON.stringify(buf.toString('latin1'))}`)
  return { lid: parseInt(m[1], 16), qpn: parseInt(m[2], 16), psn: parseInt(m[3], 16), gid: Buffer.from(m[4], 'hex') }
}

const printDest = (label, d) => console.log(`  ${label} LID 0x${d.lid.toString(16).padStart(4, '0')}, QPN 0x${d.qpn.toString(16).padStart(6, '0')}, PSN 0x${d.psn.toString(16).padStart(6, '0')}, GID ${gidPretty(d.gid)}`)

/** Reads exactly n bytes from a socket (or fewer if it ends first). */
function reader(socket) {
  let buffered = Buffer.alloc(0)
  let want = null
  let ended = false
  const settle = () => {
    if (!want) return
    if (buffered.length >= want.n || ended) {
      const { n, resolve } = want
      want = null
      const out = buffered.subarray(0, n)
      buffered = buffered.subarray(out.length)
      resolve(out)
    }
  }
  socket.on('data', (chunk) => { buffered = Buffer.concat([buffered, chunk]); settle() })
  socket.on('end', () => { ended = true; settle() })
  socket.on('error', (error) => { want?.reject(error); want = null })
  return (n) => new Promise((resolve, reject) => { want = { n, resolve, reject }; settle() })
}

const write = (socket, bytes) => new Promise((resolve, reject) => socket.write(bytes, (e) => (e ? reject(e) : resolve())))

// --- main ------------------------------------------------------------------------

const watchdog = setTimeout(() => {
  console.error(`rc-pingpong: FAILED: timed out after ${timeoutMs} ms`)
  process.exit(1)
}, timeoutMs)

const device = openDevice(v.device ?? (process.env.SOFTROCE_DEVICE || undefined))
const gidIndex = v['gid-index'] === undefined ? device.defaultGidIndex(ibPort) : int('gid-index', 0, 255)
const pd = device.allocPd()
const cq = device.createCq({ entries: rxDepth + 2 })
const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 1, maxRecvWr: rxDepth, port: ibPort, gidIndex })
const buf = pd.allocRegion(size, Access.LocalWrite)
buf.bytes.fill(0x7b) // what ibv_rc_pingpong sends
const recvBuf = pd.allocRegion(size, Access.LocalWrite)

const ep = qp.endpoint()
const my = { lid: ep.lid, qpn: ep.qpn, psn: ep.psn, gid: gidBytes(ep.gid) }
printDest('local address: ', my)

// Receives, in posting order (an RC receive queue completes in order).
const receives = []
let routs = 0
function postReceives(n) {
  for (let i = 0; i < n; i++) {
    const p = qp.recv(recvBuf.slice(0, size))
    p.catch(() => {}) // awaited in turn; the leftovers are flushed at close
    receives.push(p)
  }
  routs += n
}
async function connectQp(dest) {
  await qp.connect({ version: 1, type: 'RC', qpn: dest.qpn, psn: dest.psn, lid: dest.lid, gid: gidText(dest.gid), gidIndex, mtu, port: ibPort }, { mtu, hopLimit: 1 })
  postReceives(rxDepth)
}
async function nextReceive() {
  const wc = await receives.shift()
  if (--routs <= 1) postReceives(rxDepth - routs)
  if (wc.byteLength !== size) throw new Error(`received ${wc.byteLength} bytes, expected ${size} (use the same --size on both sides)`)
  return wc
}

let remote
if (server) {
  const listener = net.createServer()
  await new Promise((resolve, reject) => { listener.once('error', reject); listener.listen(port, resolve) })
  const socket = await new Promise((resolve) => listener.once('connection', resolve))
  listener.close()
  const read = reader(socket)
  const msg = await read(MSG_BYTES)
  if (msg.length !== MSG_BYTES) throw new Error(`${msg.length}/${MSG_BYTES}: Couldn't read remote address`)
  remote = decodeDest(msg)
  // Ready to receive before the peer learns our address: it sends at once.
  await connectQp(remote)
  await write(socket, encodeDest(my))
  const done = await read(DONE.length)
  if (!done.equals(DONE)) throw new Error(`expected "done" from the client, got ${JSON.stringify(done.toString('latin1'))}`)
  socket.end()
} else {
  const socket = net.connect({ host, port })
  await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject) })
  const read = reader(socket)
  await write(socket, encodeDest(my))
  const msg = await read(MSG_BYTES)
  if (msg.length !== MSG_BYTES) throw new Error(`${msg.length}/${MSG_BYTES}: Couldn't read remote address`)
  remote = decodeDest(msg)
  await write(socket, DONE)
  socket.end()
  await connectQp(remote)
}
printDest('remote address:', remote)

const start = performance.now()
let sent = 0
let received = 0
let lastSend = Promise.resolve()
if (!server) {
  // The client sends, then waits for that send and the answer before the next one.
  for (let i = 0; i < iters; i++) {
    await Promise.all([qp.send(buf.slice(0, size)), nextReceive()])
    sent++
    received++
  }
} else {
  // The server answers each message once its previous answer has completed.
  for (let i = 0; i < iters; i++) {
    await nextReceive()
    received++
    await lastSend
    lastSend = qp.send(buf.slice(0, size)).then(() => { sent++ })
  }
  await lastSend
}
const seconds = (performance.now() - start) / 1000
const bytes = size * iters * 2
console.log(`${bytes} bytes in ${seconds.toFixed(2)} seconds = ${((bytes * 8) / (seconds * 1e6)).toFixed(2)} Mbit/sec`)
console.log(`${iters} iters in ${seconds.toFixed(2)} seconds = ${((seconds * 1e6) / iters).toFixed(2)} usec/iter`)
console.log(`rc-pingpong: ${server ? 'server' : 'client'} OK: ${sent} sends and ${received} receives of ${size} bytes with QPN 0x${remote.qpn.toString(16)} (MTU ${mtu}, GID index ${gidIndex}, rx depth ${rxDepth})`)
clearTimeout(watchdog)
device.close()
