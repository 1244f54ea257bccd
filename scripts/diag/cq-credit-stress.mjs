// Repeats rdma/35's "small shared CQ" case: two QPs whose send CQ (16
// entries) is far smaller than their 2 x 200 writes. Prints per round how
// many settled and how; stops at the first round that does not finish.
// node scripts/diag/cq-credit-stress.mjs [rounds]
import { openDevice } from '../../dist/index.js'
import { smallSharedCq, writeAll } from './small-shared-cq.mjs'

const rounds = Number(process.argv[2] ?? 30)
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
for (let round = 0; round < rounds; round++) {
  const setup = await smallSharedCq(device)
  const { small, senders } = setup
  const { tally, settled } = writeAll(setup)
  await settled
  const state = `cq pending ${small.pending} credits used ${small.credits.used}/${small.credits.capacity}; qp outstanding ${senders.map((s) => s.outstanding)}`
  console.log(`round ${round}: ${tally.resolved} resolved, ${JSON.stringify(tally.codes)} in ${Date.now() - tally.started} ms; ${state}`)
  setup.close()
  if (tally.resolved !== tally.total) process.exit(1)
}
device.close()
