// A message acknowledged to its sender must reach the receiver even when the
// sender closes at once. (The two-host transfer bench seemed to lose its
// final "done" this way; that was the bench's own 600 s timer keeping host 0
// alive.) In one process: 60 of 60 arrived on 2026-12-01, the loop's
// ordering being the usual one; the ordering that did lose a message (the
// disconnect handled before the CQ's event) is made deterministic in rdma/40
// and rdma/60, and fixed in QueuePair.close().
// node scripts/diag/ack-then-close.mjs [cycles]
import { listen, connect, openDevice } from '../../dist/index.js'
const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const device = openDevice()
const pd = device.allocPd()
const listener = await listen({ host, port: 0, pd })
let got = 0, lost = 0, sent = 0
const outcomes = {}
listener.on('request', (request) => {
  request.accept({ receiveJson: true }).then(async (conn) => {
    try { await conn.receiveJson({ timeoutMs: 10000 }); got++ } catch (e) { lost++; outcomes[e.code] = (outcomes[e.code] ?? 0) + 1 }
    conn.close()
  }, () => {})
})
const N = Number(process.argv[2] ?? 60)
for (let i = 0; i < N; i++) {
  const client = await connect({ host, port: listener.address.port, pd, timeoutMs: 10000 })
  await client.sendJson({ i })
  sent++
  client.close()
}
await new Promise((r) => setTimeout(r, 3000))
console.log(`sent (acknowledged) ${sent}, received ${got}, lost ${lost} ${JSON.stringify(outcomes)}`)
listener.close(); device.close()
process.exit(0)
