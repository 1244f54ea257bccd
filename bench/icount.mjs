// Instructions per operation, counted by a QEMU TCG plugin in one guest boot:
// each path of the library, a C loop (ibv_post_send + ibv_poll_cq) and
// perftest, user and kernel instructions apart. Unlike time under emulation,
// the counts do not depend on the host's load or the guest's slow clock.
//
//   npm run bench -- icount [--n 4000] [--warm-s 4] [--only read,poll] [--profile] [--no-references] [--variants DIR,...]
//   npm run bench -- icount --cold --only 'await qp.read() (event CQ),tagged read: ,engine: await write()' [--variants ...]
//
// --cold: each path of --only in a fresh Node process of its own: its
// operations 1-10, 11-100 and 101-1000 counted as they come, then warmed up
// and counted as usual ([warm]): what a process that starts, moves a batch
// and exits pays.
//
// --variants: also counts other versions of the library in the same boot,
// each a directory made by `bash bench/icount/snapshot.sh NAME` (its lib
// compiled and its addon); their rows are labelled [NAME]. One boot then
// gives a before/after per change.
//
// On the host: builds bench/icount/{plugin.c, marker.c, verbs-loop.c} into
// bench/icount/build/, puts a qemu-system-x86_64 wrapper that loads the
// plugin first in PATH, boots the guest through scripts/softroce.sh and joins
// the plugin's REGION lines with the labels the guest printed, in order.
// In the guest (--guest): runs the paths between markers.
import { spawn, spawnSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { runIfMain } from './entry.mjs'
import { createRequire } from 'node:module'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const src = join(here, 'icount')
const build = join(src, 'build')
// perftest's client runs twice (N and 11N iterations) inside regions: (R(11N) - R(N)) / 10N removes its
// setup. Its setup varies by millions of instructions (a time-bound calibration spin, under emulation);
// with 3N instead of 11N that was larger than the 2N READs' own count (rows of -364 per READ on 2026-12-02).
const PERFTEST_N = 3000
const PERFTEST_LONG = 11 * PERFTEST_N

const DISCARDED = '(discarded)'

function option(argv, name, fallback) {
  const i = argv.indexOf(name)
  return i < 0 ? fallback : argv[i + 1]
}

function sh(cmd, args) {
  const r = spawnSync(cmd, args, { stdio: ['ignore', 'inherit', 'inherit'] })
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (exit ${r.status})`)
}

/** Builds the plugin, the marker module and the C loop (plain gcc: the toolchain node-gyp needs anyway). */
export function buildTools() {
  mkdirSync(build, { recursive: true })
  sh('gcc', ['-O2', '-Wall', '-shared', '-fPIC', '-o', join(build, 'icount-plugin.so'), join(src, 'plugin.c'), '-lpthread'])
  const nodeInclude = resolve(dirname(process.execPath), '..', 'include', 'node')
  sh('gcc', ['-O2', '-Wall', '-shared', '-fPIC', `-I${nodeInclude}`, '-o', join(build, 'marker.node'), join(src, 'marker.c')])
  sh('gcc', ['-O2', '-Wall', '-o', join(build, 'verbs-loop'), join(src, 'verbs-loop.c'), '-libverbs'])
}

/** A qemu-system-x86_64 to put first in PATH: loads the plugin writing to `out` (none without `out`). */
export function qemuWrapper(out, profile, append = '', smp = '') {
  const real = spawnSync('sh', ['-c', 'command -v qemu-system-x86_64'], { encoding: 'utf8' }).stdout.trim()
  if (!real) throw new Error('qemu-system-x86_64 not found (bash scripts/softroce.sh provision installs it)')
  const bin = join(build, out ? 'qbin' : append || smp ? 'qbin-append' : 'qbin-plain')
  mkdirSync(bin, { recursive: true })
  const plugin = out ? `-plugin ${join(build, 'icount-plugin.so')},out=${out}${profile ? ',profile=on' : ''}` : ''
  // no_timer_check: on a loaded host the guest kernel's IO-APIC timer check can fail and panic at boot.
  // `append`: more kernel parameters (bench/latency.mjs's clocksource); `smp`: the guest's vCPUs instead of 2.
  writeFileSync(join(bin, 'qemu-system-x86_64'), `#!/bin/bash
args=()
while (($#)); do
  if [[ $1 == -append ]]; then args+=("$1" "$2 no_timer_check${append ? ' ' + append : ''}"); shift 2
  elif [[ $1 == -smp && -n "${smp}" ]]; then args+=("$1" "${smp}"); shift 2
  else args+=("$1"); shift; fi
done
exec ${real} ${plugin} "\${args[@]}"
`)
  chmodSync(join(bin, 'qemu-system-x86_64'), 0o755)
  return bin
}

/**
 * Boots the Soft-RoCE guest once (2 GiB, 30 min; boot and rxe get 600 s, slow
 * under the plugin) with `bin` (a qemuWrapper()) first in PATH, and runs
 * `node SCRIPT --guest ARGV` in it. Returns its exit code and all it printed on stdout.
 */
export async function bootGuest(script, argv, bin) {
  const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--mode', 'vm', '--memory', '2048', '--timeout', '1800', '--',
    process.execPath, script, '--guest', ...argv],
  { cwd: root, stdio: ['ignore', 'pipe', 'inherit'], env: { SOFTROCE_BOOT_TIMEOUT: '600', SOFTROCE_RXE_TIMEOUT: '600', ...process.env, PATH: `${bin}:${process.env.PATH}` } })
  let out = ''
  child.stdout.on('data', (d) => { out += d })
  const code = await new Promise((r) => child.on('close', r))
  return { code, out }
}

function parseRegions(text) {
  return text.split('\n').filter((l) => l.startsWith('REGION ')).map((line) => {
    const f = line.split(' ')
    const get = (k) => Number(f[f.indexOf(k) + 1])
    return { user: get('user'), kernel: get('kernel'), tbs: f.includes('tbs_user') ? get('tbs_user') + get('tbs_kernel') : undefined }
  })
}

/** Per-operation rows: a label seen once is R/n; seen twice, at n1 < n2 (perftest), it is (R(n2) - R(n1)) / (n2 - n1). */
export function rows(labels, regions) {
  const byLabel = new Map()
  labels.forEach((l, i) => {
    if (l.label === DISCARDED) return
    if (!byLabel.has(l.label)) byLabel.set(l.label, [])
    byLabel.get(l.label).push({ ...l, ...regions[i] })
  })
  return [...byLabel.values()].map((runs) => {
    if (runs.length === 2 && runs[1].n > runs[0].n) {
      const [a, b] = runs
      const n = b.n - a.n
      return { label: a.label, n, user: (b.user - a.user) / n, kernel: (b.kernel - a.kernel) / n, us: b.us, tbs: b.tbs === undefined ? undefined : (b.tbs - a.tbs) / n }
    }
    // The same n counted more than once: the smallest user count (V8 may compile in the background during one).
    const r = runs.reduce((best, x) => (x.user < best.user ? x : best))
    return { label: r.label, n: r.n, user: r.user / r.n, kernel: r.kernel / r.n, us: r.us, polls: r.polls, tbs: r.tbs === undefined ? undefined : r.tbs / r.n }
  })
}

const k = (v) => (v >= 10000 ? `${(v / 1000).toFixed(1)}k` : v >= 1000 ? `${(v / 1000).toFixed(2)}k` : v.toFixed(0))

export function markdown(table, meta) {
  const out = [`Instructions per 8-byte operation in the guest (${meta})`, '',
    '| path | user insns/op | kernel insns/op | µs/op under the plugin | polls/op | blocks translated/op |', '|---|---:|---:|---:|---:|---:|']
  for (const r of table) {
    out.push(`| ${r.label} | ${k(r.user)} | ${k(r.kernel)} | ${typeof r.us !== 'number' || !Number.isFinite(r.us) ? '–' : r.us.toFixed(1)} | ${r.polls === undefined ? '–' : r.polls.toFixed(2)} | ${r.tbs === undefined ? '–' : r.tbs.toFixed(2)} |`)
  }
  return out.join('\n') + '\n'
}

// --- in the guest ------------------------------------------------------------

/** Runs a child, forwarding its @icount lines; other output goes to stderr. */
function forward(cmd, args, onLine = (line) => line.startsWith('@icount ') && process.stdout.write(line + '\n'), env = process.env) {
  return new Promise((resolveRun, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'], env })
    let rest = ''
    child.stdout.on('data', (d) => {
      const lines = (rest + d).split('\n')
      rest = lines.pop()
      for (const line of lines) onLine(line) || process.stderr.write(line + '\n')
    })
    child.on('error', reject)
    child.on('close', (code) => {
      if (rest) onLine(rest) || process.stderr.write(rest + '\n')
      code === 0 ? resolveRun() : reject(new Error(`${cmd} exited with ${code}`))
    })
  })
}

async function guest(argv) {
  const { mark } = createRequire(import.meta.url)(join(build, 'marker.node'))
  const { PERFTEST, parse, run, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const device = process.env.SOFTROCE_DEVICE || 'rxe0'
  const addr = process.env.SOFTROCE_ADDR || '127.0.0.1'
  const gidIndex = roceV2Ipv4GidIndex(device)
  const n = Number(option(argv, '--n', 4000))
  const only = option(argv, '--only', undefined)
  const emit = (o) => process.stdout.write('@icount ' + JSON.stringify(o) + '\n')

  // perftest: the server is started and left to listen, then the client runs
  // inside a region, for N and for 11N iterations.
  let port = 19515
  const perf = async (label, test) => {
    const [tool, ...extra] = PERFTEST[test]
    for (const iters of [PERFTEST_N, PERFTEST_LONG]) {
      const args = [...extra, '-d', device, '-x', String(gidIndex), '-F', '-p', String(port++), '-n', String(iters)]
      if (test.endsWith('_bw')) args.push('-t', '1')
      else args.push('-s', '8')
      const server = run(tool, args, 300_000)
      let client
      for (let attempt = 0; attempt < 20; attempt++) {
        await new Promise((r) => setTimeout(r, attempt === 0 ? 3000 : 1000))
        mark(1)
        client = await run(tool, [...args, addr], 300_000)
        mark(2)
        if (!/Couldn't connect|Unable to init the socket/.test(client.out)) break
        emit({ label: DISCARDED, n: iters }) // the server was not listening yet
      }
      await server
      const r = parse(client.out)
      if (!r) throw new Error(`${tool} gave no result:\n${client.out}`)
      emit({ label, n: iters, us: r.kind === 'lat' ? r.tTypical : 1 / r.mpps })
    }
  }
  const references = !argv.includes('--no-references') // perftest and the C loop (a quicker run without)
  if (references) await perf('perftest ib_read_lat (busy poll)', 'read_lat')
  const profile = argv.includes('--profile') // name the profile's JIT addresses: V8's perf map, printed with the mappings
  const pathArgs = [...(profile ? ['--perf-basic-prof'] : []), join(src, 'node-paths.mjs'), join(build, 'marker.node'), '--n', String(n), '--warm-s', option(argv, '--warm-s', '4'),
    ...(only ? ['--only', only] : []), ...(profile ? ['--maps'] : [])]
  const variants = option(argv, '--variants', '').split(',').filter(Boolean)
  // --cold: one process per path (each path's first operations are its own).
  const runs = argv.includes('--cold') ? (only ?? '').split(',').filter(Boolean).map((label) => [...pathArgs.filter((a, i) => a !== '--only' && pathArgs[i - 1] !== '--only'), '--only', label, '--cold'])
    : [pathArgs]
  for (const args of runs) {
    if (variants.length === 0) await forward(process.execPath, args) // with variants, only those (snapshot the working tree too)
    for (const dir of variants) {
      const variant = resolve(root, dir)
      const addon = join(variant, 'node_ibverbs.node')
      await forward(process.execPath, [...args, '--dist', join(variant, 'dist'), '--tag', basename(variant)], undefined,
        existsSync(addon) ? { ...process.env, NODE_IBVERBS_ADDON: addon } : process.env)
    }
  }
  if (references) await forward(join(build, 'verbs-loop'), [device, String(gidIndex), String(n)], (line) => {
    const m = /^verbs-loop (\w+) (\d+) ([\d.]+)/.exec(line)
    if (!m) return false
    emit({ label: `C loop: ibv_post_send + ibv_poll_cq, ${m[1]}`, n: Number(m[2]), us: Number(m[3]) })
    return true
  })
  if (references) await perf('perftest ib_atomic_bw FETCH_AND_ADD (tx depth 1)', 'atomic_fadd_bw')
}

// --- on the host ----------------------------------------------------------------

async function host(argv) {
  buildTools()
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const dir = join(root, 'bench', 'results', `icount-${stamp}`)
  mkdirSync(dir, { recursive: true })
  const log = join(dir, 'plugin.log')
  if (existsSync(log)) rmSync(log)
  const bin = qemuWrapper(log, argv.includes('--profile'))
  const { code, out } = await bootGuest(fileURLToPath(import.meta.url), argv, bin)
  const labels = out.split('\n').filter((l) => l.startsWith('@icount ')).map((l) => JSON.parse(l.slice(8)))
  const regions = existsSync(log) ? parseRegions(readFileSync(log, 'utf8')) : []
  if (labels.length === 0 || labels.length !== regions.length) {
    process.stdout.write(out)
    throw new Error(`${labels.length} labels but ${regions.length} plugin regions (guest exit ${code}); plugin output: ${log}`)
  }
  const table = rows(labels, regions)
  writeFileSync(join(dir, 'results.json'), JSON.stringify({ labels, regions, table }, null, 2) + '\n')
  const md = markdown(table, `${new Date().toISOString().slice(0, 10)}, Node ${process.version}, one boot`)
  writeFileSync(join(dir, 'results.md'), md)
  process.stdout.write(md)
  console.error(`icount: wrote ${dir}/{results.json,results.md,plugin.log}`)
  if (code !== 0) process.exitCode = code
}

export async function main(argv) {
  if (argv[0] === '--guest') return guest(argv.slice(1))
  return host(argv)
}

runIfMain(import.meta.url, main, 'icount')
