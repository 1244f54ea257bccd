#!/usr/bin/env node
// agent.stats() as Prometheus metrics with prom-client: per-peer bytes,
// transfers, work requests, notifications, errors, reconnects, transfers in
// flight and transfer latency p50/p99, read from the agent at every scrape.
// Two agents on this machine's device move some blocks, then /metrics is
// served on 127.0.0.1 (loopback only) and scraped once; --serve-ms keeps it
// up for that long for a real Prometheus.
//
//   node examples/transfer-metrics.mjs [--transfers 20] [--http-port 0] [--serve-ms 0] [--host ADDR]
import { createServer } from 'node:http'
import { exampleArgs, localAddress } from './cli-args.mjs'
import client from 'prom-client'
import { TransferAgent } from 'node-ibverbs'

const usage = 'usage: transfer-metrics.mjs [--transfers 20] [--http-port 0] [--serve-ms 0] [--host ADDR] [--device NAME]'
const { values: v, int } = exampleArgs(usage, {
  transfers: { type: 'string', default: '20' },
  'http-port': { type: 'string', default: '0' },
  'serve-ms': { type: 'string', default: '0' },
  host: { type: 'string' },
  device: { type: 'string' },
})
const TRANSFERS = int('transfers', 1, 1e6)
const device = v.device ?? process.env.NODE_IBVERBS_DEVICE ?? process.env.SOFTROCE_DEVICE

/**
 * Registers the agents' metrics in `registry`, labelled by agent and peer.
 * Each metric reads agent.stats() when scraped (prom-client's collect()), so
 * nothing runs between scrapes. The counters in stats() only grow while an
 * agent lives: they are Prometheus counters, set to the current value at each scrape.
 */
export function agentMetrics(agents, registry) {
  const labelNames = ['agent', 'peer']
  const perPeer = (set) => function collect() {
    this.reset()
    for (const agent of agents) {
      for (const s of Object.values(agent.stats().peers)) set(this, { agent: agent.name, peer: s.name }, s)
    }
  }
  const counter = (name, help, key) => new client.Counter({
    name, help, labelNames, registers: [registry],
    collect: perPeer((m, labels, s) => m.inc(labels, s[key])),
  })
  const gauge = (name, help, key) => new client.Gauge({
    name, help, labelNames, registers: [registry],
    collect: perPeer((m, labels, s) => m.set(labels, s[key])),
  })
  counter('rdma_transfer_bytes_total', 'Bytes moved by transfers this agent started', 'bytes')
  counter('rdma_transfers_total', 'Transfers completed', 'transfers')
  counter('rdma_transfer_work_requests_total', 'Work requests posted for transfers (after coalescing and slicing)', 'workRequests')
  counter('rdma_transfer_errors_total', 'Transfers that failed', 'errors')
  counter('rdma_transfer_reconnects_total', 'Links to the peer set up again after a failure', 'reconnects')
  counter('rdma_notifications_sent_total', 'Notifications sent', 'notificationsSent')
  counter('rdma_notifications_received_total', 'Notifications received', 'notificationsReceived')
  gauge('rdma_transfers_in_flight', 'Transfers started and not settled', 'inFlight')
  new client.Gauge({
    name: 'rdma_transfer_latency_seconds', help: 'Transfer latency over the last 1024 transfers, by quantile',
    labelNames: [...labelNames, 'quantile'], registers: [registry],
    collect: perPeer((m, labels, s) => {
      m.set({ ...labels, quantile: '0.5' }, s.p50Ms / 1000)
      m.set({ ...labels, quantile: '0.99' }, s.p99Ms / 1000)
    }),
  })
}

const host = localAddress(v.host, device) // --host, $SOFTROCE_ADDR or the device's IPv4 address
const decode = await TransferAgent.create({ host, port: 0, name: 'decode', ...(device ? { device } : {}) })
const prefill = await TransferAgent.create({ host, port: 0, name: 'prefill', qpsPerPeer: 2, ...(device ? { device } : {}) })
try {
  decode.register('kv-pool', { size: 1 << 20, remote: 'read-write' })
  const cache = prefill.register('kv-cache', { size: 1 << 20 })
  const peer = await prefill.connect({ host, port: decode.port, timeoutMs: 30_000 })
  const offsets = Float64Array.from({ length: 64 }, (_, i) => ((i * 37) % 64) * 16384) // 64 scattered 16 KiB blocks
  for (let i = 0; i < TRANSFERS; i++) {
    const blocks = { local: cache, remote: 'kv-pool', localOffsets: offsets, remoteOffsets: offsets.slice().reverse(), blockSize: 16384 }
    await (i % 2 ? prefill.read(peer, blocks, { timeoutMs: 30_000 }) : prefill.write(peer, blocks, { notify: `batch ${i}`, timeoutMs: 30_000 }))
  }

  const registry = new client.Registry()
  agentMetrics([prefill, decode], registry)
  const server = createServer(async (req, res) => {
    if (req.url !== '/metrics') { res.writeHead(404).end(); return }
    res.writeHead(200, { 'content-type': registry.contentType }).end(await registry.metrics())
  })
  server.listen(int('http-port', 0, 65535), '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  const url = `http://127.0.0.1:${server.address().port}/metrics`
  const scraped = await (await fetch(url)).text()
  console.log(`# scraped ${url}\n${scraped.trimEnd()}`)
  const serveMs = int('serve-ms', 0, 2 ** 31 - 1)
  if (serveMs > 0) {
    console.error(`serving ${url} for ${serveMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, serveMs))
  }
  server.close()
} finally {
  prefill.close()
  decode.close()
}
