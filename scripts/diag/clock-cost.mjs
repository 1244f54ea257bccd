// Where does the guest's time go in a tagged READ loop that instructions do
// not explain? Times, in one process: performance.now() itself (the guest's
// clocksource), then N tagged READs (postRead, then cq.poll() until reported)
// on a busy CQ whose inline spin reads the clock (spinMicros 50, the default)
// and on one that never spins (spinMicros 0); then N READs through the
// addon's bound post and poll alone (no library JS per request).
//   bash scripts/softroce.sh run -- node scripts/diag/clock-cost.mjs [N]
import { readFileSync } from 'node:fs'
import { openDevice } from '../../dist/index.js'
import { connectedPair, rawReadLoop, taggedReadLoop } from '../../bench/pair.mjs'

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
  const pair = await connectedPair(device, 'busy', { spinMicros })
  const run = taggedReadLoop(pair)
  run(N) // warm-up
  run.polls = 0
  t0 = performance.now()
  run(N)
  const us = ((performance.now() - t0) * 1000) / N
  for (const x of [pair.c, pair.s]) { x.qp.close(); x.cq.close(); x.mr.deregister() }
  return { us, pollsPerRead: run.polls / N }
}
async function rawReadUs() {
  const run = rawReadLoop(await connectedPair(device, 'busy'))
  run(N)
  t0 = performance.now()
  run(N)
  return { us: ((performance.now() - t0) * 1000) / N }
}
const spin = await taggedReadUs(50)
const noSpin = await taggedReadUs(0)
const raw = await rawReadUs()
console.log(JSON.stringify({ clocksource, performanceNowUs: +nowUs.toFixed(2), taggedRead: { spinMicros50: spin, spinMicros0: noSpin }, rawBoundRead: raw }))
device.close()
