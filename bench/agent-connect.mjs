#!/usr/bin/env node
// A transfer agent's connect() (the whole handshake: QPs or socket, hello,
// welcome, tables) with and without options.admission: a secret (one more
// control message, two HMACs per side) and a secret with an allow-list.
// N sequential connect() + closePeer() per series after 3 warm-ups, the
// listening agent offering 8 segments; the series interleaved, two rounds;
// p50 and p90 per series.
//
//   node bench/agent-connect.mjs --transport tcp             (host: no device needed)
//   bash scripts/softroce.sh run -- node bench/agent-connect.mjs
//
// Options: --transport rdma|tcp (rdma), --host ADDR (SOFTROCE_ADDR, else 198.18.0.1; tcp: 127.0.0.1), --n N (30), --rounds N (2).
import { parseArgs } from 'node:util'
import { TransferAgent } from 'node-ibverbs'

const { values } = parseArgs({ options: { transport: { type: 'string', default: 'rdma' }, host: { type: 'string' }, n: { type: 'string', default: '30' }, rounds: { type: 'string', default: '2' } } })
const transport = values.transport
const host = values.host ?? (transport === 'tcp' ? '127.0.0.1' : process.env.SOFTROCE_ADDR ?? '198.18.0.1')
const n = Number(values.n)
const secret = 'a shared secret of the cluster, 32+'
const series = { none: undefined, secret: { secret }, 'secret + allow': { secret, allow: ['client'] } }

async function time(admission) {
  const server = await TransferAgent.create({ host, transport, name: 'server', ...(admission ? { admission } : {}) })
  for (let i = 0; i < 8; i++) server.register(`s${i}`, { size: 4096, remote: 'read' })
  const client = await TransferAgent.create({ host, transport, name: 'client', ...(admission ? { admission } : {}) })
  const times = []
  try {
    for (let i = 0; i < n + 3; i++) {
      const t0 = process.hrtime.bigint()
      const peer = await client.connect({ host, port: server.port, timeoutMs: 20_000 })
      if (i >= 3) times.push(Number(process.hrtime.bigint() - t0) / 1e6)
      client.closePeer(peer)
      await new Promise((resolve) => setTimeout(resolve, 20)) // the listening side drops its end
    }
  } finally {
    client.close()
    server.close()
  }
  times.sort((a, b) => a - b)
  return { p50: times[times.length >> 1], p90: times[Math.floor(times.length * 0.9)] }
}

console.log(`| round | admission | p50 ms | p90 ms |  (${transport}, ${host}, ${n} connects each)`)
console.log('|---|---|---:|---:|')
for (let round = 1; round <= Number(values.rounds); round++) {
  for (const [name, admission] of Object.entries(series)) {
    const { p50, p90 } = await time(admission)
    console.log(`| ${round} | ${name} | ${p50.toFixed(2)} | ${p90.toFixed(2)} |`)
  }
}
