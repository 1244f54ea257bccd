#!/usr/bin/env node
// perftest vs node-ibverbs, interleaved, several rounds; writes
// bench/results/<timestamp>/{results.json, results.md, chart.svg} and prints
// the Markdown table.
//
//   bash scripts/softroce.sh run -- npm run bench        (inside the environment)
//   npm run bench                                       (on a host without RDMA:
//        re-runs itself through scripts/softroce.sh and writes the files here)
//
// Options: --full (8 B..1 MiB, powers of two), --sizes 8,4096, --rounds N,
//   --tests write_bw,read_lat, --variants event,busy,event+batch,busy+batch,
//   --tx-depth N, --scale F (multiplies iteration counts), --out DIR,
//   --from-log FILE (write the files from a captured guest log).
//   `npm run bench -- transfer [OPTIONS]` runs bench/transfer.mjs instead;
//   `npm run bench -- plan [OPTIONS]` bench/plan.mjs (on the host);
//   `npm run bench -- notify [OPTIONS]` bench/notify-pingpong.mjs --compare.
import { spawn } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { commonOption, hasDevice } from './entry.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const BEGIN = '@@node-ibverbs-bench-results-begin@@'
const END = '@@node-ibverbs-bench-results-end@@'

function parseArgs(argv) {
  const o = { full: false, sizes: undefined, rounds: 3, tests: undefined, variants: undefined, txDepth: 128, scale: 1, out: undefined, fromLog: undefined, quiet: false }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const val = () => { if (i + 1 >= argv.length) throw new Error(`${a} needs a value`); return argv[++i] }
    switch (a) {
      case '--full': o.full = true; break
      case '--sizes': o.sizes = val().split(',').map(Number); break
      case '--rounds': o.rounds = Number(val()); break
      case '--tests': o.tests = val().split(','); break
      case '--variants': o.variants = val().split(','); break
      case '--tx-depth': o.txDepth = Number(val()); break
      case '--scale': o.scale = Number(val()); break
      default: commonOption(o, a, val, import.meta.url, 15) // --out, --from-log, --quiet, --help
    }
  }
  return o
}

const SHORT_SIZES = [8, 4096, 65536, 1 << 20]
const FULL_SIZES = Array.from({ length: 18 }, (_, i) => 8 << i) // 8 B .. 1 MiB
const BW_VARIANTS = ['event', 'busy', 'event+batch', 'busy+batch']
const LAT_VARIANTS = ['event', 'busy']

/** Iteration counts: enough bytes to be meaningful on Soft-RoCE, short enough for a ~5 min run. */
function itersFor(test, size, scale) {
  const clamp = (v, lo, hi) => Math.max(lo, Math.min(hi, Math.round(v)))
  if (test.startsWith('atomic')) return clamp(3000 * scale, 50, 1e6)
  if (test.endsWith('_bw')) return clamp(((32 << 20) / size) * scale, 64, 5000 * Math.max(1, scale))
  return clamp(((8 << 20) / size) * scale, 20, 1000 * Math.max(1, scale))
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n === 0 ? NaN : n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2 }
const fmt = (v, d = 2) => (v === undefined || v === null || Number.isNaN(v) ? '–' : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(d))
const sizeName = (n) => (n >= 1 << 20 ? `${n / (1 << 20)} MiB` : n >= 1024 ? `${n / 1024} KiB` : `${n} B`)

async function measure(opts) {
  const { runBench, BW_TESTS, LAT_TESTS } = await import('../dist/cli/bench.js')
  const { perftest, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const { listDevices } = await import('../dist/index.js')
  const device = process.env.SOFTROCE_DEVICE || process.env.NODE_IBVERBS_DEVICE || listDevices()[0]?.name
  if (!device) throw new Error('no RDMA device: run through `bash scripts/softroce.sh run -- npm run bench`')
  const addr = process.env.SOFTROCE_ADDR || '127.0.0.1'
  const gidIndex = roceV2Ipv4GidIndex(device)
  const tests = opts.tests ?? [...BW_TESTS, ...LAT_TESTS]
  const sizes = opts.sizes ?? (opts.full ? FULL_SIZES : SHORT_SIZES)
  const log = (s) => { if (!opts.quiet) process.stderr.write(s + '\n') }
  log(`bench: device ${device}, gid index ${gidIndex}, peer ${addr}, tests ${tests.join(',')}, sizes ${sizes.join(',')}, ${opts.rounds} rounds`)

  const rows = new Map() // key -> row
  const rowFor = (test, size, variant) => {
    const key = `${test}|${size}|${variant}`
    if (!rows.has(key)) rows.set(key, { test, size, variant, kind: test.endsWith('_bw') ? 'bw' : 'lat', perftest: [], ours: [], errors: [] })
    return rows.get(key)
  }
  const started = Date.now()
  for (let round = 1; round <= opts.rounds; round++) {
    for (const test of tests) {
      const isBw = test.endsWith('_bw')
      const testSizes = test.startsWith('atomic') ? [8] : sizes
      const variants = (opts.variants ?? (isBw ? BW_VARIANTS : LAT_VARIANTS))
        .filter((v) => !(test.startsWith('atomic') && v.includes('batch')))
        .filter((v) => isBw || !v.includes('batch'))
      for (const size of testSizes) {
        const iters = itersFor(test, size, opts.scale)
        // perftest first, then each of our variants: interleaved per round.
        let pt
        try {
          pt = await perftest({ test, size, iters, txDepth: opts.txDepth, device, gidIndex, addr })
        } catch (e) {
          log(`  perftest ${test} ${size}: ${String(e.message).split('\n').slice(0, 3).join(' | ')}`)
        }
        for (const variant of variants) {
          const row = rowFor(test, size, variant)
          if (pt) row.perftest.push(pt)
          try {
            const r = await runBench({ test, size, iters, poll: variant.startsWith('busy') ? 'busy' : 'event', batch: variant.includes('batch'), txDepth: opts.txDepth, device })
            row.ours.push(r)
            const ours = isBw ? `${fmt(r.mbPerSec)} MB/s ${r.mpps.toFixed(4)} Mpps` : `typ ${fmt(r.tTypical)} µs p99 ${fmt(r.p99)} µs`
            const theirs = pt ? (isBw ? `${fmt(pt.mbPerSec)} MB/s` : `typ ${fmt(pt.tTypical)} µs`) : 'n/a'
            log(`  [r${round} ${((Date.now() - started) / 1000).toFixed(0)}s] ${test} ${sizeName(size)} ${variant}: ours ${ours} | perftest ${theirs}`)
          } catch (e) {
            row.errors.push(String(e?.message ?? e))
            log(`  ${test} ${size} ${variant}: ERROR ${e?.message ?? e}`)
          }
        }
      }
    }
    // In a guest, hand over what we have after every round: a run killed by
    // the environment's timeout still leaves its completed rounds.
    if (process.env.SOFTROCE_MODE === 'vm' && round < opts.rounds) emit(snapshot(round))
  }
  return snapshot(opts.rounds)

  function snapshot(roundsDone) {
    return {
    version: 1,
    date: new Date().toISOString(),
    device, addr, gidIndex, rounds: opts.rounds, txDepth: opts.txDepth, node: process.version,
    units: { bw: 'MB/sec, MB = 2^20 bytes (as perftest)', lat: 'µs; write/send: half round trip (as perftest)' },
    rows: [...rows.values()].map(summarize),
    roundsCompleted: roundsDone,
    }
  }
}

function emit(results) {
  const b64 = Buffer.from(JSON.stringify(results)).toString('base64').replace(/(.{100})/g, '$1\n')
  process.stdout.write(`${BEGIN}\n${b64}\n${END}\n`)
}

function summarize(row) {
  const pick = row.kind === 'bw' ? (r) => r.mbPerSec : (r) => r.tTypical
  const p = row.perftest.map(pick), o = row.ours.map(pick)
  // Ratio ours/perftest per round (pairs from the same round), then median and spread.
  const ratios = o.map((v, i) => (p[i] ? v / p[i] : NaN)).filter((x) => Number.isFinite(x))
  const s = {
    ...row,
    perftestMedian: median(p), oursMedian: median(o),
    ratioMedian: median(ratios), ratioMin: ratios.length ? Math.min(...ratios) : NaN, ratioMax: ratios.length ? Math.max(...ratios) : NaN,
  }
  if (row.kind === 'bw') {
    s.perftestMpps = median(row.perftest.map((r) => r.mpps)); s.oursMpps = median(row.ours.map((r) => r.mpps))
  } else {
    s.perftestP99 = median(row.perftest.map((r) => r.p99)); s.oursP99 = median(row.ours.map((r) => r.p99))
  }
  return s
}

export function markdown(results) {
  const out = []
  out.push(`perftest vs node-ibverbs on ${results.device} (${results.rounds} rounds, tx depth ${results.txDepth}, Node ${results.node}, ${results.date})`)
  out.push('')
  out.push('Bandwidth (MB/sec, MB = 2^20 B; ratio = ours / perftest, higher is better; median [min–max] over rounds)')
  out.push('')
  out.push('| test | size | variant | perftest MB/s | ours MB/s | perftest Mpps | ours Mpps | ratio | spread |')
  out.push('|---|---:|---|---:|---:|---:|---:|---:|---|')
  for (const r of results.rows.filter((r) => r.kind === 'bw')) {
    out.push(`| ${r.test} | ${sizeName(r.size)} | ${r.variant} | ${fmt(r.perftestMedian)} | ${fmt(r.oursMedian)} | ${fmt(r.perftestMpps, 4)} | ${fmt(r.oursMpps, 4)} | ${fmt(r.ratioMedian)} | ${fmt(r.ratioMin)}–${fmt(r.ratioMax)}${r.errors.length ? ` (${r.errors.length} errors)` : ''} |`)
  }
  out.push('')
  out.push('Latency (µs; t_typical = median; write/send = half round trip as perftest; ratio = ours / perftest t_typical, lower is better)')
  out.push('')
  out.push('| test | size | variant | perftest typ | ours typ | perftest p99 | ours p99 | ratio | spread |')
  out.push('|---|---:|---|---:|---:|---:|---:|---:|---|')
  for (const r of results.rows.filter((r) => r.kind === 'lat')) {
    out.push(`| ${r.test} | ${sizeName(r.size)} | ${r.variant} | ${fmt(r.perftestMedian)} | ${fmt(r.oursMedian)} | ${fmt(r.perftestP99)} | ${fmt(r.oursP99)} | ${fmt(r.ratioMedian)} | ${fmt(r.ratioMin)}–${fmt(r.ratioMax)}${r.errors.length ? ` (${r.errors.length} errors)` : ''} |`)
  }
  return out.join('\n') + '\n'
}

// --- chart: one small log-log panel per test, perftest vs each variant -----

const COLORS = { perftest: '#000000', event: '#1f77b4', busy: '#d62728', 'event+batch': '#2ca02c', 'busy+batch': '#ff7f0e' }
const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;')

export function chart(results) {
  const tests = [...new Set(results.rows.map((r) => r.test))]
  const cols = 3, pw = 320, ph = 220, m = { l: 56, r: 12, t: 28, b: 38 }
  const rowsN = Math.ceil(tests.length / cols)
  const W = cols * pw, H = rowsN * ph + 40
  const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">`, `<rect width="100%" height="100%" fill="white"/>`]
  tests.forEach((test, idx) => {
    const x0 = (idx % cols) * pw, y0 = Math.floor(idx / cols) * ph
    const rows = results.rows.filter((r) => r.test === test)
    const bw = rows[0].kind === 'bw'
    const series = new Map()
    series.set('perftest', new Map())
    for (const r of rows) {
      if (Number.isFinite(r.perftestMedian)) series.get('perftest').set(r.size, r.perftestMedian)
      if (!series.has(r.variant)) series.set(r.variant, new Map())
      if (Number.isFinite(r.oursMedian)) series.get(r.variant).set(r.size, r.oursMedian)
    }
    const xs = rows.map((r) => r.size), ys = [...series.values()].flatMap((s) => [...s.values()]).filter((v) => v > 0)
    if (!ys.length) return
    const lx0 = Math.log2(Math.min(...xs)), lx1 = Math.max(Math.log2(Math.max(...xs)), lx0 + 1)
    const ly0 = Math.floor(Math.log10(Math.min(...ys))), ly1 = Math.max(Math.ceil(Math.log10(Math.max(...ys))), ly0 + 1)
    const X = (v) => x0 + m.l + ((Math.log2(v) - lx0) / (lx1 - lx0)) * (pw - m.l - m.r)
    const Y = (v) => y0 + ph - m.b - ((Math.log10(v) - ly0) / (ly1 - ly0)) * (ph - m.t - m.b)
    parts.push(`<text x="${x0 + pw / 2}" y="${y0 + 16}" text-anchor="middle" font-weight="bold">${esc(test)} (${bw ? 'MB/s, higher is better' : 't_typical µs, lower is better'})</text>`)
    parts.push(`<rect x="${x0 + m.l}" y="${y0 + m.t}" width="${pw - m.l - m.r}" height="${ph - m.t - m.b}" fill="none" stroke="#999"/>`)
    for (let e = ly0; e <= ly1; e++) {
      const y = Y(10 ** e)
      parts.push(`<line x1="${x0 + m.l}" x2="${x0 + pw - m.r}" y1="${y}" y2="${y}" stroke="#eee"/><text x="${x0 + m.l - 4}" y="${y + 4}" text-anchor="end">${10 ** e >= 1 ? 10 ** e : (10 ** e).toPrecision(1)}</text>`)
    }
    for (const s of [...new Set(xs)].sort((a, b) => a - b)) {
      parts.push(`<text x="${X(s)}" y="${y0 + ph - m.b + 14}" text-anchor="middle">${esc(sizeName(s).replace(' ', ''))}</text>`)
    }
    parts.push(`<text x="${x0 + m.l + (pw - m.l - m.r) / 2}" y="${y0 + ph - 8}" text-anchor="middle" fill="#555">message size</text>`)
    for (const [name, pts] of series) {
      const p = [...pts.entries()].sort((a, b) => a[0] - b[0])
      if (!p.length) continue
      const color = COLORS[name] ?? '#888'
      const dash = name === 'perftest' ? '' : ' stroke-dasharray="5,3"'
      parts.push(`<polyline fill="none" stroke="${color}" stroke-width="${name === 'perftest' ? 2.5 : 1.5}"${dash} points="${p.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(' ')}"/>`)
      for (const [x, y] of p) parts.push(`<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="2.5" fill="${color}"><title>${esc(name)} ${sizeName(x)}: ${fmt(y)}</title></circle>`)
    }
  })
  let lx = 10
  const shown = new Set(['perftest', ...results.rows.map((r) => r.variant)])
  for (const [name, color] of Object.entries(COLORS).filter(([name]) => shown.has(name))) {
    parts.push(`<line x1="${lx}" x2="${lx + 24}" y1="${H - 16}" y2="${H - 16}" stroke="${color}" stroke-width="2.5"${name === 'perftest' ? '' : ' stroke-dasharray="5,3"'}/><text x="${lx + 28}" y="${H - 12}">${esc(name === 'perftest' ? 'perftest' : 'ours: ' + name)}</text>`)
    lx += 150
  }
  parts.push('</svg>')
  return parts.join('\n') + '\n'
}

function write(results, outDir) {
  const dir = outDir ?? join(root, 'bench', 'results', results.date.replace(/[:.]/g, '-'))
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, 'results.json'), JSON.stringify(results, null, 2) + '\n')
  writeFileSync(join(dir, 'results.md'), markdown(results))
  writeFileSync(join(dir, 'chart.svg'), chart(results))
  return dir
}

function extract(log) {
  const a = log.lastIndexOf(BEGIN), b = log.lastIndexOf(END)
  if (a < 0 || b < a) return undefined
  return JSON.parse(Buffer.from(log.slice(a + BEGIN.length, b).replace(/\s+/g, ''), 'base64').toString('utf8'))
}

async function main() {
  const argv = process.argv.slice(2)
  // `npm run bench -- locks`: the lock-table benchmark (bench/locks.mjs).
  if (argv[0] === 'locks') return (await import('./locks.mjs')).main(argv.slice(1))
  if (argv[0] === 'icount') return (await import('./icount.mjs')).main(argv.slice(1)) // instructions per operation
  if (argv[0] === 'latency') return (await import('./latency.mjs')).main(argv.slice(1)) // small-message time ratios
  if (argv[0] === 'plan') return (await import('./plan.mjs')).main(argv.slice(1)) // planning time and heap per block (host, TCP)
  if (argv[0] === 'notify') return (await import('./notify-pingpong.mjs')).main(argv.slice(1)) // notified writes, two processes, against ib_write_lat
  // `npm run bench -- transfer ...`: the transfer engine's benchmark (bench/transfer.mjs).
  if (argv[0] === 'transfer') return (await import('./transfer.mjs')).main(argv.slice(1))
  const opts = parseArgs(argv)
  if (opts.fromLog) {
    const results = extract(readFileSync(opts.fromLog, 'utf8'))
    if (!results) throw new Error(`no results block in ${opts.fromLog}`)
    const dir = write(results, opts.out)
    process.stdout.write(markdown(results))
    console.error(`bench: wrote ${dir}/{results.json,results.md,chart.svg}`)
    return
  }
  if (!process.env.SOFTROCE_MODE && !(await hasDevice())) {
    // No RDMA here: run inside the Soft-RoCE environment, capture the results block, write the files on this side.
    console.error('bench: no RDMA device here; running inside the Soft-RoCE environment (bash scripts/softroce.sh run -- ...)')
    const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--timeout', '1800', '--', process.execPath, fileURLToPath(import.meta.url), ...argv], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] })
    let log = ''
    child.stdout.on('data', (d) => { log += d })
    const code = await new Promise((r) => child.on('close', r))
    const results = extract(log)
    if (results && results.roundsCompleted < results.rounds) console.error(`bench: only ${results.roundsCompleted} of ${results.rounds} rounds completed (exit ${code})`)
    if (!results) {
      process.stdout.write(log)
      throw new Error(`the run in the Soft-RoCE environment produced no results (exit ${code})`)
    }
    const dir = write(results, opts.out)
    process.stdout.write(markdown(results))
    console.error(`bench: wrote ${dir}/{results.json,results.md,chart.svg}`)
    process.exitCode = code ?? 1
    return
  }
  const results = await measure(opts)
  const dir = write(results, opts.out)
  process.stdout.write(markdown(results))
  if (process.env.SOFTROCE_MODE === 'vm') {
    // The guest's filesystem is a throwaway overlay: hand the results to the host on stdout.
    console.error(`bench: ${dir} is inside the guest and disappears with it; the block below carries the results (node bench/run.mjs --from-log LOG writes the files)`)
    emit(results)
  } else {
    console.error(`bench: wrote ${dir}/{results.json,results.md,chart.svg}`)
  }
}

main().catch((e) => {
  console.error(`bench: ${e?.stack ?? e}`)
  process.exit(1)
})
