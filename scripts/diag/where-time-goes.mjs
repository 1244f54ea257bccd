// The guest runs a tagged READ from Node 4-5x slower per instruction than the
// same READ from C. Is the time spent running instructions, or somewhere the
// instruction counts cannot see (interrupts, IPIs, TLB shootdowns, idle vCPUs,
// context switches)? For the C loop, the addon's bound post+poll, and the
// tagged READ, this prints µs per READ and, per READ, the deltas of
// /proc/interrupts (by kind), /proc/stat (jiffies by state, summed over CPUs)
// and context switches.
//   bash scripts/softroce.sh run -- node scripts/diag/where-time-goes.mjs [N]
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { openDevice } from '../../dist/index.js'
import { roceV2Ipv4GidIndex } from '../../bench/perftest.mjs'
import { connectedPair, rawReadLoop, taggedReadLoop } from '../../bench/pair.mjs'

const N = Number(process.argv[2] ?? 20000)
const here = dirname(fileURLToPath(import.meta.url))

/** Interrupt counts summed over CPUs, by name (LOC, RES, CAL, TLB, and device lines by their last word). */
function interrupts() {
  const lines = readFileSync('/proc/interrupts', 'utf8').trim().split('\n')
  const cpus = lines[0].trim().split(/\s+/).length
  const out = {}
  for (const line of lines.slice(1)) {
    const [name, ...rest] = line.trim().split(/\s+/)
    const counts = rest.slice(0, cpus).map(Number)
    if (counts.some(Number.isNaN)) continue
    const key = /^\d+:$/.test(name) ? rest[rest.length - 1] : name.replace(':', '')
    out[key] = (out[key] ?? 0) + counts.reduce((a, b) => a + b, 0)
  }
  return out
}
/** Jiffies by state summed over CPUs, and the context-switch count. */
function stat() {
  const text = readFileSync('/proc/stat', 'utf8')
  const cpu = text.match(/^cpu\s+(.*)$/m)[1].split(/\s+/).map(Number)
  const names = ['user', 'nice', 'system', 'idle', 'iowait', 'irq', 'softirq']
  const out = Object.fromEntries(names.map((n, i) => [n, cpu[i]]))
  out.ctxt = Number(text.match(/^ctxt (\d+)/m)[1])
  return out
}
function snapshot() { return { irq: interrupts(), stat: stat(), t: performance.now() } }
function perOp(a, b, n) {
  const d = (x, y) => Object.fromEntries(Object.keys(y).map((k) => [k, +(((y[k] - (x[k] ?? 0)) / n).toFixed(3))]).filter(([, v]) => v !== 0))
  return { usPerOp: +(((b.t - a.t) * 1000) / n).toFixed(1), irq: d(a.irq, b.irq), jiffies: d(a.stat, b.stat) }
}

const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const results = {}

// 1. The C loop (bench/icount/verbs-loop, built by `npm run bench -- icount`).
const loop = join(here, '../../bench/icount/build/verbs-loop')
{
  const a = snapshot()
  const out = execFileSync(loop, [device.name, String(roceV2Ipv4GidIndex(device)), String(N), 'read'], { encoding: 'utf8' })
  const b = snapshot()
  // The run includes a warm-up of its own; the loop reports its timed µs per op.
  results.cLoop = { ...perOp(a, b, N), loopReports: out.trim() }
}

function measure(name, run) {
  run(Math.min(N, 5000)) // warm-up
  const a = snapshot()
  run(N)
  const b = snapshot()
  results[name] = perOp(a, b, N)
}

// 2. The addon's bound post and poll alone; 3. the tagged READ, polled until reported.
measure('rawBound', rawReadLoop(await connectedPair(device, 'busy')))
measure('taggedRead', taggedReadLoop(await connectedPair(device, 'busy')))
console.log(JSON.stringify({ n: N, cpus: readFileSync('/proc/cpuinfo', 'utf8').match(/^processor/gm).length, ...results }, null, 1))
process.exit(0)
