// Per-operation cost of small operations, for profiling inside the guest:
//   node bench/profile-ops.mjs [--ops read,write,fadd,wbatch] [--modes busy,event] [--n 3000] [--profile]
// Prints ops/s (one outstanding: latency; depth 32 for *_bw variants) and,
// with --profile, the top self-time functions (in-process V8 profiler).
import { performance } from 'node:perf_hooks'
import { Session } from 'node:inspector/promises'
import { openDevice } from '../dist/index.js'
import { connectedPair } from './pair.mjs'

const args = process.argv.slice(2)
const opt = (name, dflt) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : dflt }
const ops = opt('--ops', 'read,write,fadd').split(',')
const modes = opt('--modes', 'busy,event').split(',')
const n = Number(opt('--n', '3000'))
const profile = args.includes('--profile')


async function run(device, op, mode, count) {
  const { c, s } = await connectedPair(device, mode)
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const one = op === 'read' ? () => c.qp.read(local, remote)
    : op === 'write' ? () => c.qp.write(local, remote)
    : op === 'fadd' ? () => c.qp.fetchAndAdd(remote, 1n)
    : null
  const batchOps = Array.from({ length: 32 }, () => ({ op: 'write', local, remote }))
  const stats = { polls: 0, hits: 0 }
  if (args.includes('--count-polls')) {
    const h = c.cq.handle, orig = h.poll
    Object.defineProperty(h, 'poll', { value: function () { stats.polls++; const r = orig.call(h); if (r > 0) stats.hits++; return r } })
  }
  const lat = async (k) => { for (let i = 0; i < k; i++) await one() }
  // depth-limited pipeline (like bench bandwidth)
  const bw = (k, depth, unit, fn) => new Promise((resolve, reject) => {
    let posted = 0, done = 0
    const issue = () => {
      while (posted < k && posted - done + unit <= depth) {
        posted += unit
        fn().then(() => { done += unit; if (done >= k) resolve(); else issue() }, reject)
      }
    }
    issue()
  })
  const body = op === 'wbatch' ? (k) => bw(k, 128, 32, () => c.qp.postBatch(batchOps, { completions: 'last' }))
    : op.endsWith('_bw') ? (k) => { const base = op.slice(0, -3); const f = base === 'read' ? () => c.qp.read(local, remote) : base === 'write' ? () => c.qp.write(local, remote) : () => c.qp.fetchAndAdd(remote, 1n); return bw(k, 128, 1, f) }
    : lat
  await body(Math.min(200, count))
  const t0 = performance.now()
  stats.polls = 0; stats.hits = 0
  await body(count)
  const dt = performance.now() - t0
  if (args.includes('--count-polls')) console.log(`  polls/op ${(stats.polls / count).toFixed(2)}, non-empty polls/op ${(stats.hits / count).toFixed(2)}`)
  device.close()
  return { dt, perOpUs: (dt * 1000) / count, opsPerSec: count / (dt / 1000) }
}

function summarize(prof, top = 25) {
  const self = new Map()
  const byId = new Map(prof.nodes.map((nd) => [nd.id, nd]))
  const dts = prof.timeDeltas
  const counts = new Map()
  for (let i = 0; i < prof.samples.length; i++) counts.set(prof.samples[i], (counts.get(prof.samples[i]) ?? 0) + (dts[i] ?? 0))
  let total = 0
  for (const [id, t] of counts) {
    const nd = byId.get(id)
    const f = nd.callFrame
    const key = `${f.functionName || '(anon)'} ${f.url.split('/').slice(-2).join('/')}:${f.lineNumber + 1}`
    self.set(key, (self.get(key) ?? 0) + t)
    total += t
  }
  const rows = [...self].sort((a, b) => b[1] - a[1]).slice(0, top)
  for (const [k, t] of rows) console.log(`  ${(100 * t / total).toFixed(1).padStart(5)}%  ${(t / 1000).toFixed(1).padStart(8)} ms  ${k}`)
}

for (const mode of modes) {
  for (const op of ops) {
    let session
    if (profile) { session = new Session(); session.connect(); await session.post('Profiler.enable'); await session.post('Profiler.setSamplingInterval', { interval: 100 }); await session.post('Profiler.start') }
    const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
    const r = await run(device, op, mode, n)
    console.log(`${op} ${mode}: ${n} ops in ${r.dt.toFixed(0)} ms: ${r.perOpUs.toFixed(1)} µs/op, ${r.opsPerSec.toFixed(0)} ops/s`)
    if (profile) { const { profile: p } = await session.post('Profiler.stop'); session.disconnect(); summarize(p) }
  }
}
