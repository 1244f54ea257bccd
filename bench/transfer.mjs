#!/usr/bin/env node
// The transfer engine against perftest, in the same boot, interleaved: each
// round runs ib_write_bw (ib_read_bw) at the block size for the same bytes,
// then the engine moving those bytes as random non-contiguous blocks with 1, 2
// and 4 QPs per peer; then ib_write_lat against notified writes of the same
// bytes: 1 block of 4 KiB, and 16 blocks of 4 KiB (64 KiB). Ratios are ours / perftest per round; the table shows
// their median. Writes bench/results/transfer-<time>/{results.json,
// results.md, chart.svg} and prints the Markdown.
//
//   npm run bench -- transfer                  (runs itself in the Soft-RoCE guest if needed)
//   bash scripts/softroce.sh run --memory 2048 -- node bench/transfer.mjs
//
// Options: --rounds N (3), --mib N (64: bytes per transfer), --sizes 65536,16384,4096,
//   --qps 1,2,4, --ops write,read, --lat-iters N (1000, 0 = no latency rows),
//   --lat-warm-s N (5: untimed notified writes before each latency case's timed ones),
//   --out DIR, --from-log FILE (write the files from a captured guest log), --quiet.
import { spawn } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { commonOption, hasDevice } from './entry.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const BEGIN = '@@node-ibverbs-transfer-bench-begin@@'
const END = '@@node-ibverbs-transfer-bench-end@@'
const MiB = 1 << 20
/** The issue's targets: engine / ib_write_bw at the block size. */
export const TARGETS = { 65536: 0.95, 16384: 0.9, 4096: 0.8 }
const PERFTEST_TEST = { write: 'write_bw', read: 'read_bw' }
const TX_DEPTH = 128
/** The notified writes timed against ib_write_lat of the same bytes, with the issue's targets (notified / ib_write_lat). */
export const LATENCY_CASES = [
  { blocks: 1, bytes: 4096, target: 2, pollMode: 'event' }, { blocks: 16, bytes: 65536, target: 1.5, pollMode: 'event' },
  // The agents' data CQs busy-polled (pollMode 'busy'), as perftest's tools poll: no wakeup on either side.
  { blocks: 1, bytes: 4096, target: 2, pollMode: 'busy' }, { blocks: 16, bytes: 65536, target: 1.5, pollMode: 'busy' },
]

function parseArgs(argv) {
  const o = { rounds: 3, mib: 64, sizes: [65536, 16384, 4096], qps: [1, 2, 4], ops: ['write', 'read'], latIters: 1000, latWarmS: 5, out: undefined, fromLog: undefined, quiet: false }
  const list = (v) => v.split(',').map(Number)
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => { if (i + 1 >= argv.length) throw new Error(`${a} needs a value`); return argv[++i] }
    switch (a) {
      case '--rounds': o.rounds = Number(val()); break
      case '--mib': o.mib = Number(val()); break
      case '--sizes': o.sizes = list(val()); break
      case '--qps': o.qps = list(val()); break
      case '--ops': o.ops = val().split(','); break
      case '--lat-iters': o.latIters = Number(val()); break
      case '--lat-warm-s': o.latWarmS = Number(val()); break
      default: commonOption(o, a, val, import.meta.url, 17) // --out, --from-log, --quiet, --help
    }
  }
  return o
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n === 0 ? NaN : n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2 }
const fmt = (v, d = 2) => (v === undefined || v === null || Number.isNaN(v) ? '–' : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(d))
const sizeName = (n) => (n >= MiB ? `${n / MiB} MiB` : n >= 1024 ? `${n / 1024} KiB` : `${n} B`)
const load = () => loadavg().map((l) => l.toFixed(1)).join(' ')

async function measure(opts) {
  const { TransferBench } = await import('../dist/cli/bench-transfer.js')
  const { perftest, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const { notifyFloor } = await import('./notify-floor.mjs')
  const bench = await TransferBench.open({ maxBytes: opts.mib * MiB })
  // A latency case with busy-polled data CQs gets agents of its own, closed after it: their polling would load every other case.
  const latencyOf = async (pollMode, bytes, blocks) => {
    const o = { warmupMs: opts.latWarmS * 1000, blocks }
    if (pollMode !== 'busy') return bench.notifyLatency(bytes, opts.latIters, o)
    const busy = await TransferBench.open({ maxBytes: MiB, pollMode: 'busy' })
    try { return await busy.notifyLatency(bytes, opts.latIters, o) } finally { busy.close() }
  }
  const device = bench.target.device.name
  const addr = bench.host
  const gidIndex = roceV2Ipv4GidIndex(device)
  const log = (s) => { if (!opts.quiet) process.stderr.write(s + '\n') }
  log(`transfer bench: ${device}, gid index ${gidIndex}, ${addr}, ${opts.mib} MiB per transfer, sizes ${opts.sizes.join(',')}, qps ${opts.qps.join(',')}, ${opts.ops.join(',')}, ${opts.rounds} rounds; load average ${load()}`)
  const rows = new Map()
  const rowFor = (op, size, qps) => {
    const key = `${op}|${size}|${qps}`
    if (!rows.has(key)) rows.set(key, { op, size, blocks: (opts.mib * MiB) / size, qps, perftest: [], ours: [], ratios: [], errors: [] })
    return rows.get(key)
  }
  const latencies = LATENCY_CASES.map((c) => ({ ...c, perftest: [], sendLat: [], floor: [], ours: [], ratios: [], errors: [] }))
  const loads = [load()]
  const started = Date.now()
  const at = () => `${((Date.now() - started) / 1000).toFixed(0)}s`
  try {
    for (let round = 1; round <= opts.rounds; round++) {
      for (const op of opts.ops) {
        for (const size of opts.sizes) {
          const iters = (opts.mib * MiB) / size
          let pt
          try {
            pt = await perftest({ test: PERFTEST_TEST[op], size, iters, txDepth: TX_DEPTH, device, gidIndex, addr, timeoutMs: 600_000 })
          } catch (e) {
            log(`  perftest ${op} ${size}: ${String(e.message).split('\n').slice(0, 3).join(' | ')}`)
          }
          for (const qps of opts.qps) {
            const row = rowFor(op, size, qps)
            try {
              const r = await bench.run({ op, blocks: iters, blockSize: size, qps })
              row.ours.push(r)
              if (pt) { row.perftest.push(pt); row.ratios.push(r.mbPerSec / pt.mbPerSec) }
              log(`  [r${round} ${at()}] ${op} ${iters} x ${sizeName(size)} qps ${qps}: ours ${fmt(r.mbPerSec)} MB/s (${r.workRequests} WRs, plan ${fmt(r.planMs)} ms) | ib_${op}_bw ${pt ? `${fmt(pt.mbPerSec)} MB/s` : 'n/a'}`)
            } catch (e) {
              row.errors.push(String(e?.message ?? e))
              log(`  ${op} ${size} qps ${qps}: ERROR ${e?.stack ?? e}`)
            }
          }
        }
      }
      if (opts.latIters > 0) {
        for (const latency of latencies) {
          const { blocks, bytes, pollMode } = latency
          let pt
          try {
            pt = await perftest({ test: 'write_lat', size: bytes, iters: opts.latIters, txDepth: TX_DEPTH, device, gidIndex, addr })
          } catch (e) {
            log(`  perftest write_lat ${bytes}: ${String(e.message).split('\n').slice(0, 3).join(' | ')}`)
          }
          // The fabric's floor for data that raises a completion at the receiver (what a notification needs), without our code.
          if (pollMode === 'busy') {
            await perftest({ test: 'send_lat', size: bytes, iters: opts.latIters, txDepth: TX_DEPTH, device, gidIndex, addr })
              .then((p) => latency.sendLat.push(p), (e) => log(`  perftest send_lat ${bytes}: ${String(e.message).split('\n')[0]}`))
          }
          // The same work requests through the verbs layer alone (bench/notify-floor.mjs): what the engine adds is above it.
          await notifyFloor({ size: bytes, blocks, pollMode, iters: opts.latIters, warmupMs: opts.latWarmS * 1000 })
            .then((f) => latency.floor.push(f), (e) => log(`  notify-floor ${bytes}: ${String(e?.message ?? e).split('\n')[0]}`))
          try {
            const r = await latencyOf(pollMode, bytes, blocks)
            latency.ours.push(r)
            // A perftest run whose output gave no typical latency has no ratio (it is in the log as 'n/a').
            if (pt && Number.isFinite(pt.tTypical)) { latency.perftest.push(pt); latency.ratios.push(r.notifiedTypical / pt.tTypical) }
            log(`  [r${round} ${at()}] ${blocks} x ${sizeName(bytes / blocks)} write + notification (${pollMode} CQs): notified typ ${fmt(r.notifiedTypical)} µs, resolved typ ${fmt(r.resolvedTypical)} µs | ib_write_lat ${sizeName(bytes)} typ ${pt && Number.isFinite(pt.tTypical) ? fmt(pt.tTypical) : 'n/a'} µs`)
          } catch (e) {
            latency.errors.push(String(e?.message ?? e))
            log(`  latency: ERROR ${e?.stack ?? e}`)
          }
        }
      }
      loads.push(load())
      if (process.env.SOFTROCE_MODE === 'vm' && round < opts.rounds) emit(snapshot(round))
    }
  } finally {
    bench.close()
  }
  return snapshot(opts.rounds)

  function snapshot(roundsDone) {
    return {
      version: 1, date: new Date().toISOString(), device, addr, gidIndex, node: process.version,
      rounds: opts.rounds, roundsCompleted: roundsDone, mib: opts.mib, txDepth: TX_DEPTH, latencyWarmupS: opts.latWarmS,
      loadAverages: loads,
      rows: [...rows.values()].map((r) => ({
        op: r.op, size: r.size, blocks: r.blocks, qps: r.qps, target: TARGETS[r.size],
        perftestMedian: median(r.perftest.map((p) => p.mbPerSec)), oursMedian: median(r.ours.map((o) => o.mbPerSec)),
        ratioMedian: median(r.ratios), ratioMin: Math.min(...r.ratios), ratioMax: Math.max(...r.ratios),
        workRequests: r.ours[0]?.workRequests, planMs: median(r.ours.map((o) => o.planMs)),
        perftest: r.perftest, ours: r.ours, ratios: r.ratios, errors: r.errors,
      })),
      latencies: latencies.map((latency) => ({
        blocks: latency.blocks, bytes: latency.bytes, target: latency.target, pollMode: latency.pollMode,
        perftestTypical: median(latency.perftest.map((p) => p.tTypical)), perftestP99: median(latency.perftest.map((p) => p.p99)),
        sendLatTypical: median((latency.sendLat ?? []).map((p) => p.tTypical)), sendLatP99: median((latency.sendLat ?? []).map((p) => p.p99)),
        floorTypical: median(latency.floor.map((f) => f.typical)), floorP99: median(latency.floor.map((f) => f.p99)),
        notifiedTypical: median(latency.ours.map((o) => o.notifiedTypical)), notifiedP99: median(latency.ours.map((o) => o.notifiedP99)),
        resolvedTypical: median(latency.ours.map((o) => o.resolvedTypical)), resolvedP99: median(latency.ours.map((o) => o.resolvedP99)),
        ratioMedian: median(latency.ratios), ratioMin: Math.min(...latency.ratios), ratioMax: Math.max(...latency.ratios),
        ...latency,
      })),
    }
  }
}

export function markdown(r) {
  const out = []
  out.push(`Transfer engine vs perftest on ${r.device} (${r.roundsCompleted} of ${r.rounds} rounds, ${r.mib} MiB per transfer, Node ${r.node}, ${r.date}; load average (1, 5, 15 min) in the guest ${r.loadAverages[0]} at the start, ${r.loadAverages.at(-1)} at the end${r.hostLoadAverages ? `; on the host ${r.hostLoadAverages[0]} at the start, ${r.hostLoadAverages.at(-1)} at the end` : ''})`)
  out.push('')
  out.push('Bandwidth (MB/sec, MB = 2^20 B; ratio = ours / perftest in the same round, median [min–max]; perftest = ib_write_bw or ib_read_bw, 1 QP, -t 128, at the block size)')
  out.push('')
  out.push('| op | blocks | qps | WRs | perftest MB/s | ours MB/s | ratio | spread | target |')
  out.push('|---|---|---:|---:|---:|---:|---:|---|---:|')
  for (const row of r.rows) {
    const meets = row.op === 'write' && row.target !== undefined && Number.isFinite(row.ratioMedian) ? (row.ratioMedian >= row.target ? ' (met)' : ' (missed)') : ''
    out.push(`| ${row.op} | ${row.blocks} x ${sizeName(row.size)} | ${row.qps} | ${row.workRequests ?? '–'} | ${fmt(row.perftestMedian)} | ${fmt(row.oursMedian)} | ${fmt(row.ratioMedian)} | ${fmt(row.ratioMin)}–${fmt(row.ratioMax)}${row.errors.length ? ` (${row.errors.length} errors)` : ''} | ${row.target ?? '–'}${meets} |`)
  }
  // Results written before 2026-12-04 have one case, as `latency`.
  const latencies = (r.latencies ?? (r.latency ? [{ blocks: 1, bytes: 4096, ...r.latency }] : [])).filter((l) => l.ours.length || l.perftest.length)
  if (latencies.length) {
    out.push('')
    const warm = r.latencyWarmupS === undefined ? '' : r.latencyWarmupS > 0 ? `, timed after ${r.latencyWarmupS} s of untimed ones` : ', timed from the first (no warm-up)'
    out.push(`Latency of notified writes (µs, median over rounds of each round's median / p99${warm}): notified = from write() until the peer\'s handler runs with the data in place; resolved = until write() resolves; ib_write_lat = half its round trip (one way), same bytes. Ratio = notified / ib_write_lat, lower is better.`)
    out.push('')
    out.push('| what | typical µs | p99 µs | ratio (notified / ib_write_lat) | target |')
    out.push('|---|---:|---:|---|---:|')
    for (const l of latencies) {
      const ratios = (l.ratios ?? []).filter(Number.isFinite)
      if (ratios.length) Object.assign(l, { ratioMedian: median(ratios), ratioMin: Math.min(...ratios), ratioMax: Math.max(...ratios) })
      const typicals = (l.perftest ?? []).map((p) => p.tTypical).filter(Number.isFinite)
      if (typicals.length) l.perftestTypical = median(typicals)
      const name = `${l.blocks} x ${sizeName(l.bytes / l.blocks)}${l.pollMode === 'busy' ? ', busy CQs' : ''}`
      const meets = l.target !== undefined && Number.isFinite(l.ratioMedian) ? (l.ratioMedian <= l.target ? ' (met)' : ' (missed)') : ''
      out.push(`| ib_write_lat ${sizeName(l.bytes)} | ${fmt(l.perftestTypical)} | ${fmt(l.perftestP99)} | | |`)
      if (Number.isFinite(l.sendLatTypical)) out.push(`| ib_send_lat ${sizeName(l.bytes)} (data + a receive completion, no library) | ${fmt(l.sendLatTypical)} | ${fmt(l.sendLatP99)} | ${fmt(l.sendLatTypical / l.perftestTypical)} | |`)
      if (Number.isFinite(l.floorTypical)) out.push(`| verbs layer, ${name}: the same work requests by qp.postBatch() (one doorbell), until recv() resolves | ${fmt(l.floorTypical)} | ${fmt(l.floorP99)} | ${fmt(l.floorTypical / l.perftestTypical)} | |`)
      out.push(`| ours, ${name}, notified | ${fmt(l.notifiedTypical)} | ${fmt(l.notifiedP99)} | ${fmt(l.ratioMedian)} [${fmt(l.ratioMin)}–${fmt(l.ratioMax)}] | ≤ ${l.target ?? '–'}${meets} |`)
      out.push(`| ours, ${name}, resolved | ${fmt(l.resolvedTypical)} | ${fmt(l.resolvedP99)} | | |`)
    }
  }
  return out.join('\n') + '\n'
}

// --- chart: ratio per block size, a bar per qps, the target as a line -------

const QPS_COLORS = { 1: '#1f77b4', 2: '#2ca02c', 4: '#ff7f0e' }

export function chart(r) {
  const ops = [...new Set(r.rows.map((x) => x.op))]
  const pw = 420, ph = 260, m = { l: 44, r: 10, t: 30, b: 40 }
  const W = pw * ops.length, H = ph + 30
  const yMax = Math.max(1.2, ...r.rows.map((x) => x.ratioMax).filter(Number.isFinite))
  const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">`, '<rect width="100%" height="100%" fill="white"/>']
  ops.forEach((op, k) => {
    const x0 = k * pw
    const rows = r.rows.filter((x) => x.op === op)
    const sizes = [...new Set(rows.map((x) => x.size))]
    const qpsList = [...new Set(rows.map((x) => x.qps))]
    const iw = pw - m.l - m.r, ih = ph - m.t - m.b
    const Y = (v) => m.t + ih - (v / yMax) * ih
    const gw = iw / sizes.length, bw = (gw * 0.7) / qpsList.length
    parts.push(`<text x="${x0 + pw / 2}" y="18" text-anchor="middle" font-weight="bold">${op}: ours / ib_${op}_bw (median, min–max)</text>`)
    for (let v = 0; v <= yMax + 1e-9; v += 0.2) {
      parts.push(`<line x1="${x0 + m.l}" x2="${x0 + pw - m.r}" y1="${Y(v)}" y2="${Y(v)}" stroke="${Math.abs(v - 1) < 1e-9 ? '#999' : '#eee'}"/><text x="${x0 + m.l - 4}" y="${Y(v) + 4}" text-anchor="end">${v.toFixed(1)}</text>`)
    }
    sizes.forEach((size, i) => {
      const gx = x0 + m.l + i * gw + gw * 0.15
      qpsList.forEach((qps, j) => {
        const row = rows.find((x) => x.size === size && x.qps === qps)
        if (!row || !Number.isFinite(row.ratioMedian)) return
        const x = gx + j * bw
        parts.push(`<rect x="${x.toFixed(1)}" y="${Y(row.ratioMedian).toFixed(1)}" width="${(bw - 2).toFixed(1)}" height="${(Y(0) - Y(row.ratioMedian)).toFixed(1)}" fill="${QPS_COLORS[qps] ?? '#888'}"><title>${op} ${row.blocks} x ${sizeName(size)}, ${qps} QPs: ${fmt(row.ratioMedian)}</title></rect>`)
        if (Number.isFinite(row.ratioMin)) parts.push(`<line x1="${(x + bw / 2 - 1).toFixed(1)}" x2="${(x + bw / 2 - 1).toFixed(1)}" y1="${Y(row.ratioMin).toFixed(1)}" y2="${Y(row.ratioMax).toFixed(1)}" stroke="#333"/>`)
      })
      const target = TARGETS[size]
      if (target !== undefined) parts.push(`<line x1="${(gx - 4).toFixed(1)}" x2="${(gx + qpsList.length * bw + 2).toFixed(1)}" y1="${Y(target).toFixed(1)}" y2="${Y(target).toFixed(1)}" stroke="#d62728" stroke-width="2" stroke-dasharray="4,2"><title>target ${target}</title></line>`)
      parts.push(`<text x="${(gx + (qpsList.length * bw) / 2).toFixed(1)}" y="${ph - m.b + 14}" text-anchor="middle">${(r.mib * MiB) / size} x ${sizeName(size).replace(' ', '')}</text>`)
    })
  })
  let lx = 10
  for (const qps of [...new Set(r.rows.map((x) => x.qps))]) {
    parts.push(`<rect x="${lx}" y="${H - 22}" width="12" height="12" fill="${QPS_COLORS[qps] ?? '#888'}"/><text x="${lx + 16}" y="${H - 12}">${qps} QP${qps > 1 ? 's' : ''} per peer</text>`)
    lx += 110
  }
  parts.push(`<line x1="${lx}" x2="${lx + 20}" y1="${H - 16}" y2="${H - 16}" stroke="#d62728" stroke-width="2" stroke-dasharray="4,2"/><text x="${lx + 24}" y="${H - 12}">target (write)</text>`)
  parts.push('</svg>')
  return parts.join('\n') + '\n'
}

function emit(results) {
  const b64 = Buffer.from(JSON.stringify(results)).toString('base64').replace(/(.{100})/g, '$1\n')
  process.stdout.write(`${BEGIN}\n${b64}\n${END}\n`)
}

function extract(text) {
  const a = text.lastIndexOf(BEGIN), b = text.lastIndexOf(END)
  if (a < 0 || b < a) return undefined
  return JSON.parse(Buffer.from(text.slice(a + BEGIN.length, b).replace(/\s+/g, ''), 'base64').toString('utf8'))
}

function write(results, outDir) {
  const dir = outDir ?? join(root, 'bench', 'results', `transfer-${results.date.replace(/[:.]/g, '-')}`)
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, 'results.json'), JSON.stringify(results, null, 2) + '\n')
  writeFileSync(join(dir, 'results.md'), markdown(results))
  writeFileSync(join(dir, 'chart.svg'), chart(results))
  return dir
}

export async function main(argv) {
  const opts = parseArgs(argv)
  if (opts.fromLog) {
    const results = extract(readFileSync(opts.fromLog, 'utf8'))
    if (!results) throw new Error(`no results block in ${opts.fromLog}`)
    process.stdout.write(markdown(results))
    console.error(`transfer bench: wrote ${write(results, opts.out)}/{results.json,results.md,chart.svg}`)
    return
  }
  if (!process.env.SOFTROCE_MODE && !(await hasDevice())) {
    // No RDMA here: run in the Soft-RoCE guest (room for 64 MiB segments and perftest), write the files on this side.
    console.error('transfer bench: no RDMA device here; running in the Soft-RoCE environment (bash scripts/softroce.sh run --memory 2048 -- ...)')
    const hostLoad = [load()]
    const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--memory', '2048', '--timeout', '5400', '--', process.execPath, fileURLToPath(import.meta.url), ...argv], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] })
    let text = ''
    child.stdout.on('data', (d) => { text += d })
    const code = await new Promise((r) => child.on('close', r))
    const results = extract(text)
    if (!results) {
      process.stdout.write(text)
      throw new Error(`the run in the Soft-RoCE environment produced no results (exit ${code})`)
    }
    hostLoad.push(load())
    results.hostLoadAverages = hostLoad // the guest's own load says nothing of the machine it runs on
    if (results.roundsCompleted < results.rounds) console.error(`transfer bench: only ${results.roundsCompleted} of ${results.rounds} rounds completed (exit ${code})`)
    process.stdout.write(markdown(results))
    console.error(`transfer bench: wrote ${write(results, opts.out)}/{results.json,results.md,chart.svg}`)
    process.exitCode = code ?? 1
    return
  }
  const results = await measure(opts)
  process.stdout.write(markdown(results))
  if (process.env.SOFTROCE_MODE === 'vm') emit(results) // the guest's files vanish with it: hand the results over on stdout
  else console.error(`transfer bench: wrote ${write(results, opts.out)}/{results.json,results.md,chart.svg}`)
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(`transfer bench: ${e?.stack ?? e}`)
    process.exit(1)
  })
}
