// Names where a counted region's instructions went: joins the plugin's TB
// lines (from `npm run bench -- icount --profile`) with the guest process's
// mappings and V8's perf map (printed by node-paths.mjs --maps to stderr) and
// nm's symbols of the libraries, and prints the top functions per region.
//   node bench/icount/profile.mjs PLUGIN_LOG GUEST_STDERR REGION_SEQ[,SEQ...] [--top 40]
// REGION_SEQ: the plugin's region numbers (results.json's labels in order, 1-based).
import { readFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'

const [log, stderrFile, seqArg] = process.argv.slice(2)
const top = Number(process.argv[process.argv.indexOf('--top') + 1]) || 40
const seqs = new Set(seqArg.split(',').map(Number))
const KERNEL = 0xffff800000000000n

const jit = []
const maps = []
for (const line of readFileSync(stderrFile, 'utf8').split('\n')) {
  if (line.startsWith('@perfmap ')) {
    const [start, size, ...name] = line.slice(9).split(' ')
    jit.push({ start: BigInt('0x' + start), end: BigInt('0x' + start) + BigInt('0x' + size), name: 'JS ' + name.join(' ') })
  } else if (line.startsWith('@maps ')) {
    const f = line.slice(6).trim().split(/\s+/)
    const [lo, hi] = f[0].split('-').map((x) => BigInt('0x' + x))
    maps.push({ lo, hi, offset: BigInt('0x' + f[2]), path: f[5] })
  }
}
jit.sort((a, b) => (a.start < b.start ? -1 : 1))

const symbolCache = new Map()
function symbols(path) {
  if (symbolCache.has(path)) return symbolCache.get(path)
  const out = []
  for (const flag of [[], ['-D']]) {
    const r = spawnSync('nm', ['-C', '--defined-only', ...flag, path], { encoding: 'utf8', maxBuffer: 1 << 30 })
    for (const l of (r.stdout || '').split('\n')) {
      const m = /^([0-9a-f]+) [tTwW] (.*)$/.exec(l)
      if (m) out.push({ at: BigInt('0x' + m[1]), name: m[2] })
    }
  }
  out.sort((a, b) => (a.at < b.at ? -1 : 1))
  symbolCache.set(path, out)
  return out
}
function lookup(list, at, key) {
  let lo = 0, hi = list.length - 1, best
  while (lo <= hi) {
    const mid = (lo + hi) >> 1
    if (list[mid][key] <= at) { best = list[mid]; lo = mid + 1 } else hi = mid - 1
  }
  return best
}
function name(addr) {
  if (addr >= KERNEL) return '[kernel]'
  const j = lookup(jit, addr, 'start')
  if (j && addr < j.end) return j.name
  const m = maps.find((x) => addr >= x.lo && addr < x.hi)
  if (!m) return '[unknown user]'
  const base = m.path.endsWith('/node') ? 0n : m.lo - m.offset // node is not PIE
  const s = lookup(symbols(m.path), addr - base, 'at')
  return `${m.path.split('/').pop()}: ${s ? s.name.slice(0, 100) : '?'}`
}

const bySeq = new Map()
for (const line of readFileSync(log, 'utf8').split('\n')) {
  if (!line.startsWith('TB ')) continue
  const [, seq, vaddr, insns, runs] = line.split(' ')
  if (!seqs.has(Number(seq))) continue
  const n = Number(insns) * Number(runs)
  const key = name(BigInt('0x' + vaddr))
  const totals = bySeq.get(seq) ?? new Map()
  totals.set(key, (totals.get(key) ?? 0) + n)
  bySeq.set(seq, totals)
}
for (const [seq, totals] of bySeq) {
  const all = [...totals.values()].reduce((a, b) => a + b, 0)
  console.log(`region ${seq}: ${all} instructions`)
  for (const [k, v] of [...totals].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${String(v).padStart(12)} ${(100 * v / all).toFixed(1).padStart(5)}%  ${k}`)
}
