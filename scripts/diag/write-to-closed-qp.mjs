// rdma/35's small-shared-CQ case, then again with the responder QPs closed
// before the writes: with retryCount 7 (the default) rxe retries forever (it
// reads 7 as infinite; the IB spec only does so for rnrRetry) and only the
// requests' timeoutMs ends them; with retryCount 6 they fail RETRY_EXC_ERR.
// node scripts/diag/write-to-closed-qp.mjs
import { openDevice } from '../../dist/index.js'
import { smallSharedCq, writeAll } from './small-shared-cq.mjs'

const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
for (const [closePeers, retryCount] of [[false, 7], [true, 7], [true, 6]]) {
  const setup = await smallSharedCq(device, { retryCount })
  if (closePeers) for (const peer of setup.peers) peer.close()
  console.log(`closePeers=${closePeers} retryCount=${retryCount}`)
  const { tally, settled } = writeAll(setup)
  const { small, senders } = setup
  const t = setInterval(() => console.log(`  ${Date.now() - tally.started} ms: resolved ${tally.resolved} codes ${JSON.stringify(tally.codes)} credits ${small.credits.used}/${small.credits.capacity} outstanding ${senders.map((s) => s.outstanding)} states ${senders.map((s) => s.state)}`), 2000)
  await settled
  clearInterval(t)
  console.log(`  done: ${tally.resolved} resolved, ${JSON.stringify(tally.codes)} in ${Date.now() - tally.started} ms`)
  setup.close()
}
device.close()
