// Time ratios of the small-message paths against perftest and a C loop, in one
// guest boot, with benchmark hygiene: warm-up first (our paths run in one
// long-lived process, warmed up for --warm-s seconds), N operations timed as a
// whole (never each one: a warmed performance.now() costs ~3 µs in the guest on
// its HPET clock, 1 µs on the TSC), every
// variant interleaved with perftest round by round, and each round run twice:
// as is, and under `chrt -f 50` (SCHED_FIFO: ksoftirqd no longer preempts the
// poster after each post, which shows the floor; our process is switched to it
// with chrt -a -p).
//
//   npm run bench -- latency [--rounds 6] [--n 2000] [--warm-s 10] [--variants DIR,...] [--clocksource tsc] [--smp 1]
// --variants: builds saved by bench/icount/snapshot.sh, each in a process of its own, timed in the same rounds.
//
// Our READ is timed three times: `await qp.read()`, the tagged path (postRead, then cq.poll() until reported),
// and Node's floor (the addon's bound post and poll, no library code per READ: bench/pair.mjs rawReadLoop);
// our FETCH_ADD too: fetchAndAdd() promises, 16 in flight, and tagged postFetchAndAdd() reposted from
// the handler, with cq.poll() in a loop.
//
// Ratios: READ latency = ours / ib_read_lat t_avg (lower is better; perftest
// busy-polls), atomics = our FETCH_ADD rate / ib_atomic_bw (higher is better).
import { execFileSync, spawn } from 'node:child_process'
import { performance } from 'node:perf_hooks'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { basename, dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { runIfMain } from './entry.mjs'
import { connectedPair, rawReadLoop, taggedReadLoop } from './pair.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const option = (argv, name, fallback) => { const i = argv.indexOf(name); return i < 0 ? fallback : argv[i + 1] }
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length ? (s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN }

/**
 * Our measurements, from one long-lived process: every path is first warmed up
 * for `--warm-s` seconds (V8's optimizing compiler runs on a background thread,
 * and in the emulated guest a fresh process runs our paths 3-7x slower for its
 * first 3-5 s: a short warm-up measures the interpreter, not the library).
 * Then each line `<what> <n>` on stdin is answered with one JSON line (µs/op or Mpps).
 */
async function child(argv) {
  const warmMs = Number(option(argv, '--warm-s', 10)) * 1000
  const dist = option(argv, '--dist', undefined) // another build of the library (bench/icount/snapshot.sh)
  const { openDevice } = await import(dist ? pathToFileURL(join(resolve(dist), 'index.js')).href : '../dist/index.js')
  const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
  const paths = {}
  for (const what of ['read', 'tagged-read', 'raw-read', 'fadd', 'tagged-fadd']) paths[what] = await ourPath(what, await connectedPair(device, 'busy'))
  for (const run of Object.values(paths)) {
    for (const t0 = performance.now(); performance.now() - t0 < warmMs;) await run(200)
  }
  console.log(JSON.stringify({ ready: true }))
  const { createInterface } = await import('node:readline')
  for await (const line of createInterface({ input: process.stdin })) {
    const [what, count] = line.trim().split(/\s+/)
    const n = Number(count)
    const t0 = performance.now()
    await paths[what](n)
    const us = ((performance.now() - t0) * 1000) / n
    console.log(JSON.stringify(what.endsWith('fadd') ? { mpps: 1 / us } : { us }))
  }
  device.close()
}

/** `run(count)` for one of our paths on its own connected pair. */
async function ourPath(what, { c, s }) {
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  if (what === 'read') return async (count) => { for (let i = 0; i < count; i++) await c.qp.read(local, remote) }
  if (what === 'tagged-read') return taggedReadLoop({ c, s }) // the lower-level path: a tagged READ, then cq.poll() until it is reported, like C
  if (what === 'raw-read') return rawReadLoop({ c, s }) // Node's floor: the addon's bound post and poll, no library code per READ
  const depth = 16 // up to 16 atomics in flight (the device's max_rd_atomic), like ib_atomic_bw
  if (what === 'tagged-fadd') { // tagged fetch-and-adds, each reposted from the handler, cq.poll() in a loop (like ib_atomic_bw)
    let posted = 0
    let reported = 0
    let count = 0
    c.qp.setCompletionHandler((tag, error) => {
      if (error) throw error
      reported++
      if (posted < count) c.qp.postFetchAndAdd(c.mr.slice(8 * tag, 8), remote, 1n, tag), posted++
    })
    return async (n) => {
      count = n
      posted = 0
      reported = 0
      for (let i = 0; i < Math.min(depth, count); i++, posted++) c.qp.postFetchAndAdd(c.mr.slice(8 * i, 8), remote, 1n, i)
      while (reported < count) c.cq.poll()
    }
  }
  return async (count) => { // fetchAndAdd promises
    let posted = 0
    const lane = async () => { while (posted < count) { posted++; await c.qp.fetchAndAdd(remote, 1n) } }
    await Promise.all(Array.from({ length: depth }, lane))
  }
}

/** The warmed-up child: `ask(what, n)` resolves with its JSON answer; `pid` for chrt -p. */
async function startChild(warmS, variant) {
  const args = [fileURLToPath(import.meta.url), '--child', '--warm-s', String(warmS)]
  let env = process.env
  if (variant) {
    variant = resolve(variant)
    args.push('--dist', join(variant, 'dist'))
    const addon = join(variant, 'node_ibverbs.node')
    if (existsSync(addon)) env = { ...env, NODE_IBVERBS_ADDON: addon }
  }
  const p = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'], env })
  let buffered = ''
  const waiting = []
  p.stdout.on('data', (d) => {
    buffered += d
    for (let i; (i = buffered.indexOf('\n')) >= 0;) {
      const line = buffered.slice(0, i)
      buffered = buffered.slice(i + 1)
      waiting.shift()?.resolve(JSON.parse(line))
    }
  })
  p.on('close', (code) => { for (const w of waiting.splice(0)) w.reject(new Error(`latency child exited ${code}`)) })
  const next = () => new Promise((resolve, reject) => waiting.push({ resolve, reject }))
  await next() // { ready: true }
  return {
    pid: p.pid,
    ask: (what, n) => { const answer = next(); p.stdin.write(`${what} ${n}\n`); return answer },
    close: () => p.stdin.end(),
  }
}

async function guest(argv) {
  const { perftest, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const device = process.env.SOFTROCE_DEVICE || 'rxe0'
  const addr = process.env.SOFTROCE_ADDR || '127.0.0.1'
  const gidIndex = roceV2Ipv4GidIndex(device)
  const rounds = Number(option(argv, '--rounds', 6))
  const n = Number(option(argv, '--n', 2000))
  const loop = join(here, 'icount', 'build', 'verbs-loop')
  const clocksource = readFileSync('/sys/devices/system/clocksource/clocksource0/current_clocksource', 'utf8').trim()
  // --variants DIR,...: other builds of the library (bench/icount/snapshot.sh), each timed in the same rounds
  const variants = option(argv, '--variants', '').split(',').filter(Boolean)
  const children = []
  for (const dir of variants.length ? variants : ['']) children.push({ name: dir ? basename(dir) : 'main', ...await startChild(Number(option(argv, '--warm-s', 10)), dir) })
  const rows = []
  for (let round = 1; round <= rounds; round++) {
    for (const fifo of [false, true]) {
      const wrap = (cmd, args) => (fifo ? ['chrt', ['-f', '50', cmd, ...args]] : [cmd, args])
      // the warmed-up children, every thread of them, under the same policy as perftest and the C loop
      for (const ours of children) execFileSync('chrt', fifo ? ['-a', '-f', '-p', '50', String(ours.pid)] : ['-a', '-o', '-p', '0', String(ours.pid)])
      const pt = await perftest({ test: 'read_lat', size: 8, iters: n, txDepth: 1, device, gidIndex, addr, wrap: fifo ? ['chrt', '-f', '50'] : [] })
      const c = await new Promise((res) => {
        const [cmd, args] = wrap(loop, [device, String(gidIndex), String(n), 'read'])
        const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] })
        let out = ''
        p.stdout.on('data', (d) => { out += d })
        p.on('close', () => res(Number(/verbs-loop read \d+ ([\d.]+)/.exec(out)?.[1])))
      })
      const reads = []
      for (const ours of children) reads.push([await ours.ask('read', n), await ours.ask('tagged-read', n), await ours.ask('raw-read', n)])
      const ptAtomic = await perftest({ test: 'atomic_fadd_bw', size: 8, iters: n, txDepth: 16, device, gidIndex, addr, wrap: fifo ? ['chrt', '-f', '50'] : [] })
      for (const [i, ours] of children.entries()) {
        const [read, tagged, raw] = reads[i]
        const oursAtomic = await ours.ask('fadd', n)
        const taggedAtomic = await ours.ask('tagged-fadd', n)
        rows.push({ variant: ours.name, clocksource, cpus: os.availableParallelism(), round, fifo, perftestReadAvg: pt.tAvg, perftestReadTypical: pt.tTypical, cLoopRead: c, oursRead: read.us, oursTaggedRead: tagged.us, oursRawRead: raw.us, perftestAtomicMpps: ptAtomic.mpps, oursAtomicMpps: oursAtomic.mpps, oursTaggedAtomicMpps: taggedAtomic.mpps })
        console.error(`latency: round ${round}${fifo ? ' chrt -f' : ''} [${ours.name}]: READ ours ${read.us.toFixed(1)} µs (tagged ${tagged.us.toFixed(1)}, raw ${raw.us.toFixed(1)}), C ${c.toFixed(1)}, ib_read_lat avg ${pt.tAvg} typ ${pt.tTypical}; FETCH_ADD ours ${oursAtomic.mpps.toFixed(4)} Mpps (tagged ${taggedAtomic.mpps.toFixed(4)}), ib_atomic_bw ${ptAtomic.mpps}`)
      }
    }
  }
  for (const ours of children) ours.close()
  console.log('@latency ' + JSON.stringify(rows))
}

export function markdown(rows) {
  const out = ['| variant | scheduling | ib_read_lat t_avg µs | C loop READ µs | C loop / ib_read_lat (same instructions: the noise) | ours `await qp.read()` µs | READ ratio ours / ib_read_lat | ours tagged `postRead` + `cq.poll()` µs | its ratio | ours raw READ (bound post + poll, no library code) µs | its ratio | ib_atomic_bw Mpps | ours fetchAndAdd Mpps | atomic ratio ours / ib_atomic_bw | ours tagged postFetchAndAdd Mpps | its ratio |',
    '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  const variants = [...new Set(rows.map((x) => x.variant ?? 'main'))]
  for (const variant of variants) for (const fifo of [false, true]) {
    const r = rows.filter((x) => x.fifo === fifo && (x.variant ?? 'main') === variant)
    if (!r.length) continue
    const m = (f) => median(r.map(f))
    out.push(`| ${variant} | ${fifo ? 'chrt -f 50' : 'default'} | ${m((x) => x.perftestReadAvg).toFixed(1)} | ${m((x) => x.cLoopRead).toFixed(1)} | ${m((x) => x.cLoopRead / x.perftestReadAvg).toFixed(2)} | ${m((x) => x.oursRead).toFixed(1)} | ${m((x) => x.oursRead / x.perftestReadAvg).toFixed(2)} | ${m((x) => x.oursTaggedRead).toFixed(1)} | ${m((x) => x.oursTaggedRead / x.perftestReadAvg).toFixed(2)} | ${m((x) => x.oursRawRead).toFixed(1)} | ${m((x) => x.oursRawRead / x.perftestReadAvg).toFixed(2)} | ${m((x) => x.perftestAtomicMpps).toFixed(4)} | ${m((x) => x.oursAtomicMpps).toFixed(4)} | ${m((x) => x.oursAtomicMpps / x.perftestAtomicMpps).toFixed(2)} | ${m((x) => x.oursTaggedAtomicMpps).toFixed(4)} | ${m((x) => x.oursTaggedAtomicMpps / x.perftestAtomicMpps).toFixed(2)} |`)
  }
  return out.join('\n') + `\n\n(guest clocksource: ${rows[0]?.clocksource}, vCPUs: ${rows[0]?.cpus}; medians over ${rows.length / 2 / variants.length} rounds; ratios are medians of each round's ratio)\n`
}

async function host(argv) {
  const { bootGuest, buildTools, qemuWrapper } = await import('./icount.mjs')
  buildTools()
  // --clocksource tsc: the guest kernel keeps the TSC, as a real machine does. It falls back to the HPET
  // under emulation, where a clock read (performance.now(), and libuv's each turn of the loop) costs ~10 µs
  // against perftest's rdtsc at ~0.1 µs; the default keeps the guest as the tests run it.
  const clocksource = option(argv, '--clocksource', 'default')
  // --smp 1: one vCPU (the host's other core is left to QEMU's own threads; rxe's softirq work and the poster share it).
  const bin = qemuWrapper(undefined, false, clocksource === 'tsc' ? 'clocksource=tsc tsc=reliable' : '', option(argv, '--smp', '')) // no plugin
  const { code, out } = await bootGuest(fileURLToPath(import.meta.url), argv, bin)
  const line = out.split('\n').find((l) => l.startsWith('@latency '))
  if (!line) {
    process.stdout.write(out)
    throw new Error(`no results from the guest (exit ${code})`)
  }
  const rows = JSON.parse(line.slice(9))
  const dir = join(here, 'results')
  mkdirSync(dir, { recursive: true })
  const file = join(dir, `latency-${new Date().toISOString().replace(/[:.]/g, '-')}.json`)
  writeFileSync(file, JSON.stringify(rows, null, 2) + '\n') // every round, for other statistics than the medians
  process.stdout.write(markdown(rows))
  console.error(`latency: wrote ${file}`)
}

export async function main(argv) {
  if (argv[0] === '--child') return child(argv.slice(1))
  if (argv[0] === '--guest') return guest(argv.slice(1))
  return host(argv)
}

runIfMain(import.meta.url, main, 'latency')
