#!/usr/bin/env node
// A node-ibverbs twin of librdmacm's `rdma_server` / `rdma_client` examples,
// over the rdma_cm API (listen/connect). It interoperates with them in either
// role:
//
//   server: node examples/rdma-echo.mjs --server [--host 0.0.0.0] [--port 7471]
//           then: rdma_client -s 198.18.0.1 -p 7471
//   client: rdma_server -p 7471
//           then: node examples/rdma-echo.mjs --host 198.18.0.1 [--port 7471]
//
// What the C programs do (rdma-core librdmacm/examples/rdma_server.c,
// rdma_client.c):
// - rdma_server binds the wildcard address (it has no -s flag, only -p),
//   serves exactly one connection and exits. It posts a 16-byte receive
//   *before* rdma_accept, waits for the client's message, SENDs 16 bytes back
//   (zeros, inline), waits for that send to complete and disconnects.
// - rdma_client (-s server, default 127.0.0.1, -p port) posts a 16-byte
//   receive, connects, SENDs 16 bytes *right after* rdma_connect returns,
//   waits for the send, then for the reply, and disconnects.
// - Both QPs have max_send_wr = max_recv_wr = 1 and 16 bytes of inline data.
// - So a server must have its receive posted before it accepts (this example
//   uses accept's `beforeAccept` hook): the client's SEND can arrive before the
//   server has even seen ESTABLISHED. Messages longer than 16 bytes overflow
//   the C side's receive (a remote operation error); shorter ones are fine.
// - rdma_client's default 127.0.0.1 does not work on Soft-RoCE (rdma_cm finds
//   no device for the loopback address): pass the rxe netdev's address.
import { performance } from 'node:perf_hooks'
import { exampleArgs } from './cli-args.mjs'
import { Access, connect, listen } from 'node-ibverbs'

const usage = `usage: rdma-echo.mjs --server [--host 0.0.0.0] [--port 7471] [--size 16] [--timeout-ms 30000]
       rdma-echo.mjs [--host H | -s H] [--port 7471] [--size 16] [--timeout-ms 30000]`

const { values: v, int } = exampleArgs(usage, {
  server: { type: 'boolean', default: false },
  host: { type: 'string', short: 's' },
  port: { type: 'string', short: 'p', default: '7471' },
  size: { type: 'string', default: '16' },
  'timeout-ms': { type: 'string', default: '30000' },
})
const port = int('port', 1, 65535)
const size = int('size', 1, 1 << 20)
const timeoutMs = int('timeout-ms', 1, 2 ** 31 - 1)
const role = v.server ? 'server' : 'client'
const host = v.host ?? (v.server ? '0.0.0.0' : (process.env.SOFTROCE_ADDR || '127.0.0.1'))

const watchdog = setTimeout(() => {
  console.error(`rdma-echo: ${role} FAILED: timed out after ${timeoutMs} ms`)
  process.exit(1)
}, timeoutMs)

// The C examples' QP: one send, one receive, 16 bytes inline.
const caps = { maxSendWr: 1, maxRecvWr: 1, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 16 }

/** Registers a buffer on the new QP's PD and posts the receive: called before accept/connect. */
function prepare(qp) {
  const region = qp.pd.allocRegion(2 * size, Access.LocalWrite)
  const received = qp.recv(region.slice(0, size))
  received.catch(() => {}) // awaited below; a failed setup closes the QP
  return { region, received }
}

const start = performance.now()
if (v.server) {
  const listener = await listen({ host, port })
  console.log(`rdma-echo: server listening on ${host}:${listener.address?.port ?? port}`)
  const request = await listener.accept()
  if (!request) throw new Error('the listener closed')
  let io
  const conn = await request.accept({ qp: caps, beforeAccept: (qp) => { io = prepare(qp) } })
  listener.close()
  const peer = conn.remoteAddress
  const wc = await io.received
  if (wc.byteLength > size) throw new Error(`received ${wc.byteLength} bytes, more than ${size}`)
  // Echo what came (the C client sends 16 zero bytes and checks only that 16 arrive).
  io.region.bytes.copyWithin(size, 0, size)
  await conn.qp.send(io.region.slice(size, size), { inline: size <= conn.qp.caps.maxInlineData })
  await conn.disconnect()
  console.log(`rdma-echo: server OK: received ${wc.byteLength} bytes from ${peer?.address}:${peer?.port}, sent ${size} bytes back (${(performance.now() - start).toFixed(1)} ms)`)
} else {
  let io
  const conn = await connect({ host, port, qp: caps, timeoutMs, beforeConnect: (qp) => { io = prepare(qp) } })
  const message = Buffer.alloc(size)
  Buffer.from('node-ibverbs echo').copy(message, 0, 0, size) // any bytes: the C server ignores them
  io.region.bytes.set(message, size)
  const sent = conn.qp.send(io.region.slice(size, size), { inline: size <= conn.qp.caps.maxInlineData }).then(() => undefined, (error) => error)
  const wc = await io.received
  if (wc.byteLength !== size) throw new Error(`received ${wc.byteLength} bytes, expected ${size}`)
  // The echo proves the server got the message. The ACK of our send can still
  // be lost behind the server's disconnect (rdma_server disconnects as soon as
  // its reply is acknowledged): the send is then flushed, although delivered.
  const failure = await sent
  if (failure && failure.code !== 'WR_FLUSH_ERR') throw failure
  await conn.disconnect()
  console.log(`rdma-echo: client OK: sent ${size} bytes to ${host}:${port}, received ${wc.byteLength} bytes back (${(performance.now() - start).toFixed(1)} ms)`)
}
clearTimeout(watchdog)
