#!/usr/bin/env node
// What planning a transfer costs: agent.prepare() (every block checked against
// both segment tables, put in remote order, coalesced, sliced, striped, the
// work requests' fields computed) for 10^4, 10^5 and 10^6 scattered blocks,
// time and memory. Runs on the host: two TCP agents on loopback (planning is
// the same code on either transport; it posts nothing). Per block it reports
// the JS heap planning allocates (heapUsed after - before, no GC in between;
// a GC during the call is counted and shown), the JS heap the plan keeps
// (after a full GC) and the ArrayBuffer bytes it keeps (its typed arrays): a
// plan that made an object per block would show tens of bytes of JS heap per
// block. Writes bench/results/plan-<time>/{results.json,results.md} and prints
// the Markdown.
//
//   npm run bench -- plan            node --expose-gc bench/plan.mjs
//
// Options: --blocks 10000,100000,1000000, --block-size 1024, --forms arrays,list,
//   --repeat N (5: time is the median of N prepares; memory from the first), --warm N (3 prepares
//   of the same blocks first, not measured), --out DIR, --quiet, --help.
import { spawnSync, execSync } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { Session } from 'node:inspector'
import { performance } from 'node:perf_hooks'
import { fileURLToPath } from 'node:url'
import { commonOption, runIfMain } from './entry.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')

function parseArgs(argv) {
  const o = { blocks: [10_000, 100_000, 1_000_000], blockSize: 1024, forms: ['arrays', 'list'], repeat: 5, warm: 3, out: undefined, quiet: false }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => { if (i + 1 >= argv.length) throw new Error(`${a} needs a value`); return argv[++i] }
    switch (a) {
      case '--blocks': o.blocks = val().split(',').map(Number); break
      case '--block-size': o.blockSize = Number(val()); break
      case '--forms': o.forms = val().split(','); break
      case '--repeat': o.repeat = Number(val()); break
      case '--warm': o.warm = Number(val()); break
      default: commonOption(o, a, val, import.meta.url, 18) // --out, --quiet, --help
    }
  }
  return o
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n === 0 ? NaN : n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2 }
const fmt = (v, d = 1) => (v === undefined || Number.isNaN(v) ? '–' : Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(d))
const tick = () => new Promise((r) => setImmediate(r))

/**
 * JS heap bytes one call of `fn` allocates, collected objects included: V8's
 * sampling heap profiler (one sample per `interval` bytes on average) through
 * the inspector, with the functions that allocated most. Starting the
 * profiler deoptimizes the code that allocates, so `fn` is called `warm`
 * times under it first; then the least of `measured` calls is counted (the
 * profile's growth across each).
 */
function allocated(fn, warm, interval = 32, measured = 3) {
  const session = new Session()
  session.connect()
  const post = (method, params) => {
    let out, err, answered = false
    session.post(method, params, (e, r) => { err = e; out = r; answered = true })
    if (err) throw err
    if (!answered) throw new Error(`the inspector did not answer ${method} at once (a profile too large? raise the sampling interval)`)
    return out
  }
  const byFunction = () => {
    const by = new Map()
    // Only what the library allocated (below a frame of dist/): not the inspector's messages.
    const walk = (node, inLibrary) => {
      const name = node.callFrame.functionName || '(anonymous)'
      inLibrary ||= node.callFrame.url.includes('/dist/')
      if (inLibrary && node.selfSize > 0) by.set(name, (by.get(name) ?? 0) + node.selfSize)
      for (const child of node.children) walk(child, inLibrary)
    }
    walk(post('HeapProfiler.getSamplingProfile').profile.head, false)
    return by
  }
  try {
    post('HeapProfiler.enable')
    post('HeapProfiler.startSampling', { samplingInterval: interval, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true })
    for (let w = 0; w < warm; w++) fn()
    // The least of `measured` calls: what the code allocates by design shows in every call, optimized code
    // that a loaded machine's compiler thread delivers late (unoptimized code boxes numbers) in some.
    let least
    for (let m = 0; m < measured; m++) {
      const before = byFunction()
      fn()
      const after = byFunction()
      const grown = [...after].map(([name, b]) => [name, b - (before.get(name) ?? 0)]).filter(([, b]) => b > 0)
      const bytes = grown.reduce((sum, [, b]) => sum + b, 0)
      if (!least || bytes < least.bytes) least = { bytes, top: grown.sort((x, y) => y[1] - x[1]).slice(0, 4) }
    }
    post('HeapProfiler.stopSampling')
    return least
  } finally {
    session.disconnect()
  }
}

/** Scattered blocks: local slots in random order, remote slots random in a pool twice as large (as bench/transfer.mjs). */
function layout(kvLayout, n, blockSize, form) {
  const { localOffsets, remoteOffsets } = kvLayout(n, blockSize, 26)
  if (form === 'arrays') return { local: 'kv', remote: 'pool', localOffsets, remoteOffsets, blockSize }
  const list = new Array(n)
  for (let i = 0; i < n; i++) list[i] = { local: ['kv', localOffsets[i]], remote: ['pool', remoteOffsets[i]], length: blockSize }
  return list
}

async function measure(o) {
  const { TransferAgent } = await import('../dist/index.js')
  const { kvLayout } = await import('../dist/cli/bench-transfer.js')
  const max = Math.max(...o.blocks)
  const target = await TransferAgent.create({ transport: 'tcp', host: '127.0.0.1', port: 0, name: 'plan-target' })
  const agent = await TransferAgent.create({ transport: 'tcp', host: '127.0.0.1', port: 0, name: 'plan-initiator', qpsPerPeer: 2 })
  const rows = []
  try {
    // Plain memory, never touched: planning reads only the lengths.
    target.register('pool', { size: 2 * max * o.blockSize, remote: 'read-write' })
    agent.register('kv', { size: max * o.blockSize })
    const peer = await agent.connect({ host: '127.0.0.1', port: target.port })
    while (!peer.segments.has('pool')) await tick()
    for (const form of o.forms) {
      // The process warmed once per form on 10^5 blocks (the first case would measure the compiler otherwise).
      const warmBlocks = layout(kvLayout, Math.min(100_000, max), o.blockSize, form)
      for (let w = 0; w < 5; w++) agent.prepare(peer, 'write', warmBlocks)
      for (const n of o.blocks) {
        let blocks = layout(kvLayout, n, o.blockSize, form)
        // Warm: the loops optimized before anything is measured (unoptimized code boxes every double it computes).
        for (let w = 0; w < o.warm; w++) agent.prepare(peer, 'write', blocks)
        globalThis.gc(); await tick(); globalThis.gc()
        const m0 = process.memoryUsage()
        const t0 = performance.now()
        let plan = agent.prepare(peer, 'write', blocks)
        const firstMs = performance.now() - t0
        const m1 = process.memoryUsage()
        globalThis.gc(); await tick(); globalThis.gc()
        const m2 = process.memoryUsage()
        // The same call again under the sampling profiler (slower: not timed): what it allocates, garbage included.
        // A sample per 32 bytes on average, fewer for many blocks (the inspector answers with every sample).
        const sampled = allocated(() => agent.prepare(peer, 'write', blocks), o.warm, Math.max(32, Math.round(n / 1000)))
        if (plan.bytes !== n * o.blockSize) throw new Error(`the plan of ${n} blocks has ${plan.bytes} bytes`)
        plan = undefined
        const times = [firstMs]
        for (let r = 1; r < o.repeat; r++) {
          const t = performance.now()
          agent.prepare(peer, 'write', blocks)
          times.push(performance.now() - t)
        }
        blocks = undefined
        rows.push({
          form, blocks: n, ms: median(times), msFirst: firstMs,
          heapAllocatedPerBlock: sampled.bytes / n, topAllocators: sampled.top,
          heapRetainedPerBlock: (m2.heapUsed - m0.heapUsed) / n,
          arrayBuffersRetainedPerBlock: (m2.arrayBuffers - m0.arrayBuffers) / n,
          arrayBuffersPeakPerBlock: (m1.arrayBuffers - m0.arrayBuffers) / n,
        })
        if (!o.quiet) process.stderr.write(`plan: ${form} ${n} blocks: ${fmt(median(times))} ms\n`)
        globalThis.gc()
      }
    }
  } finally {
    await agent.close()
    await target.close()
  }
  return rows
}

export async function main(argv) {
  if (typeof globalThis.gc !== 'function') { // heap figures need a full GC on demand: run again with --expose-gc
    const r = spawnSync(process.execPath, ['--expose-gc', fileURLToPath(import.meta.url), ...argv], { stdio: 'inherit' })
    process.exitCode = r.status ?? 1
    return
  }
  const o = parseArgs(argv)
  const load = () => loadavg().map((l) => l.toFixed(1)).join(' ')
  const loadBefore = load()
  const rows = await measure(o)
  let commit = 'unknown'
  try { commit = execSync('git rev-parse --short HEAD', { cwd: root }).toString().trim() } catch { /* not a checkout */ }
  const date = new Date().toISOString().slice(0, 10)
  const header = ['blocks as', 'blocks', 'prepare ms (median)', 'µs per block', 'JS heap allocated B/block', 'most by', 'JS heap kept B/block', 'typed arrays kept B/block', 'typed arrays at peak B/block']
  const lines = [`| ${header.join(' | ')} |`, `|${header.map((_, i) => (i < 1 ? '---' : '---:')).join('|')}|`]
  for (const r of rows) {
    lines.push(`| ${r.form === 'arrays' ? 'BlockArrays' : 'Block[]'} | ${r.blocks} | ${fmt(r.ms)} | ${fmt((r.ms * 1000) / r.blocks, 2)} | ${fmt(r.heapAllocatedPerBlock, 2)} | ${r.topAllocators.map(([f, b]) => `${f} ${fmt(b / r.blocks, 2)}`).slice(0, 2).join(', ')} | ${fmt(r.heapRetainedPerBlock, 2)} | ${fmt(r.arrayBuffersRetainedPerBlock)} | ${fmt(r.arrayBuffersPeakPerBlock)} |`)
  }
  const md = `${date}, commit ${commit}, Node ${process.version}, ${o.blockSize} B blocks (scattered; sliceBytes 64 KiB: one slice per block), 2 QPs, ${o.warm} warm-up prepares, then median of ${o.repeat}; load average ${loadBefore} → ${load()}\n\n${lines.join('\n')}\n`
  const out = o.out ?? join(root, 'bench', 'results', `plan-${new Date().toISOString().replace(/[:.]/g, '-')}`)
  mkdirSync(out, { recursive: true })
  writeFileSync(join(out, 'results.json'), JSON.stringify({ date, commit, node: process.version, options: o, rows }, null, 2))
  writeFileSync(join(out, 'results.md'), md)
  console.log(md)
}

runIfMain(import.meta.url, main, 'plan')
