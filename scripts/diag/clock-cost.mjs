// Where does the guest's time go in a tagged READ loop that instructions do
// not explain? Times, in one process: performance.now() itself (the guest's
// clocksource), then N tagged READs (postRead, then cq.poll() until reported)
// on a busy CQ whose inline spin reads the clock (spinMicros 50, the default)
// and on one that never spins (spinMicros 0); then N READs through the
// addon's bound post and poll alone (no library JS per request).
//   bash scripts/softroce.sh run -- node scripts/diag/clock-cost.mjs [N]
import { readFileSync } from 'node:fs'
import { openDevice } from '../../dist/index.js'
import { SendFlags, WrOpcode } from '../../dist/constants.js'
import { WorkRequestEncoder } from '../../dist/work-request-encoding.js'
import { connectedPair } from '../../bench/pair.mjs'

const N = Number(process.argv[2] ?? 2000)
const clocksource = (() => { try { return readFileSync('/sys/devices/system/clocksource/clocksource0/current_clocksource', 'utf8').trim() } catch { return '?' } })()

// performance.now() warmed up: the first rounds run in V8's interpreter, 10x slower in the guest
function readClock(n) { let x = 0; for (let i = 0; i < n; i++) x += performance.now(); return x }
let t0 = 0
let nowUs = 0
for (let round = 0; round < 5; round++) {
  t0 = performance.now()
  readClock(N)
  nowUs = ((performance.now() - t0) * 1000) / N
}

const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
async function taggedReadUs(spinMicros) {
  const { c, s } = await connectedPair(device, 'busy', { spinMicros })
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  let reported = false
  let polls = 0
  c.qp.setCompletionHandler((tag, error) => { if (error) throw error; reported = true })
  const run = (n) => {
    for (let i = 0; i < n; i++) {
      reported = false
      c.qp.postRead(local, remote, i)
      while (!reported) { c.cq.poll(); polls++ }
    }
  }
  run(N) // warm-up
  polls = 0
  t0 = performance.now()
  run(N)
  const us = ((performance.now() - t0) * 1000) / N
  for (const x of [c, s]) { x.qp.close(); x.cq.close(); x.mr.deregister() }
  return { us, pollsPerRead: polls / N }
}
/** The same READ through the addon's bound post and poll only (no library JS per request): Node's floor. */
async function rawReadUs() {
  const { c, s } = await connectedPair(device, 'busy')
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const enc = new WorkRequestEncoder()
  const post = c.qp.handle.sendPoster(enc.buffer, c.cq.handle)
  const poll = c.cq.handle.poller()
  let wrId = 2e9
  const run = (n) => {
    for (let i = 0; i < n; i++) {
      enc.reset()
      enc.addOne(wrId++, WrOpcode.RdmaRead, SendFlags.Signaled, local.address, 8, local.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
      if (post(0, 1, 1) > 0) continue
      while (poll() === 0);
    }
  }
  run(N)
  t0 = performance.now()
  run(N)
  const us = ((performance.now() - t0) * 1000) / N
  return { us }
}
const spin = await taggedReadUs(50)
const noSpin = await taggedReadUs(0)
const raw = await rawReadUs()
console.log(JSON.stringify({ clocksource, performanceNowUs: +nowUs.toFixed(2), taggedRead: { spinMicros50: spin, spinMicros0: noSpin }, rawBoundRead: raw }))
device.close()
