// Time ratios of the small-message paths against perftest and a C loop, in one
// guest boot, with benchmark hygiene: warm-up first, N operations timed as a
// whole (never each one: performance.now() costs 8-20 µs in the guest), every
// variant interleaved with perftest round by round, and each round run twice:
// as is, and under `chrt -f 50` (SCHED_FIFO: ksoftirqd no longer preempts the
// poster after each post, which shows the floor).
//
//   npm run bench -- latency [--rounds 3] [--n 2000]
//
// Our READ is timed twice: `await qp.read()` and the tagged path (postRead, then cq.poll() until reported).
//
// Ratios: READ latency = ours / ib_read_lat t_avg (lower is better; perftest
// busy-polls), atomics = our FETCH_ADD rate / ib_atomic_bw (higher is better).
import { spawn } from 'node:child_process'
import { performance } from 'node:perf_hooks'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { runIfMain } from './entry.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const option = (argv, name, fallback) => { const i = argv.indexOf(name); return i < 0 ? fallback : argv[i + 1] }
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length ? (s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN }

/** One of our measurements in a fresh process (so that chrt applies to it): prints µs/op or Mpps. */
async function child(argv) {
  const [what, n] = [argv[0], Number(argv[1])]
  const { openDevice } = await import('../dist/index.js')
  const { connectedPair } = await import('./pair.mjs')
  const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
  const { c, s } = await connectedPair(device, 'busy')
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const run = async (count) => {
    if (what === 'read') {
      for (let i = 0; i < count; i++) await c.qp.read(local, remote)
    } else if (what === 'tagged-read') { // the lower-level path: a tagged READ, then cq.poll() until it is reported, like C
      let reported = false
      c.qp.setCompletionHandler((tag, error) => { if (error) throw error; reported = true })
      for (let i = 0; i < count; i++) {
        reported = false
        c.qp.postRead(local, remote, i)
        while (!reported) c.cq.poll()
      }
    } else if (what === 'tagged-fadd') { // tagged fetch-and-adds, 16 in flight, each reposted from the handler
      const depth = 16
      await new Promise((resolveAll) => {
        let posted = 0
        let reported = 0
        c.qp.setCompletionHandler((tag, error) => {
          if (error) throw error
          if (++reported === count) return resolveAll()
          if (posted < count) c.qp.postFetchAndAdd(c.mr.slice(8 * tag, 8), remote, 1n, tag), posted++
        })
        for (let i = 0; i < Math.min(depth, count); i++, posted++) c.qp.postFetchAndAdd(c.mr.slice(8 * i, 8), remote, 1n, i)
      })
    } else { // fetchAndAdd with up to 16 in flight (the device's max_rd_atomic), like ib_atomic_bw
      const depth = 16
      let posted = 0
      const lane = async () => { while (posted < count) { posted++; await c.qp.fetchAndAdd(remote, 1n) } }
      await Promise.all(Array.from({ length: depth }, lane))
    }
  }
  await run(Math.max(200, n >> 1)) // warm-up
  const t0 = performance.now()
  await run(n)
  const us = ((performance.now() - t0) * 1000) / n
  console.log(JSON.stringify(what.endsWith('fadd') ? { mpps: 1 / us } : { us }))
  device.close()
}

function runJson(cmd, args) {
  return new Promise((resolveRun, reject) => {
    const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] })
    let out = ''
    p.stdout.on('data', (d) => { out += d })
    p.on('error', reject)
    p.on('close', (code) => {
      const line = out.trim().split('\n').pop()
      try { resolveRun(JSON.parse(line)) } catch { reject(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${out}`)) }
    })
  })
}

async function guest(argv) {
  const { perftest, roceV2Ipv4GidIndex } = await import('./perftest.mjs')
  const device = process.env.SOFTROCE_DEVICE || 'rxe0'
  const addr = process.env.SOFTROCE_ADDR || '127.0.0.1'
  const gidIndex = roceV2Ipv4GidIndex(device)
  const rounds = Number(option(argv, '--rounds', 3))
  const n = Number(option(argv, '--n', 2000))
  const loop = join(here, 'icount', 'build', 'verbs-loop')
  const rows = []
  for (let round = 1; round <= rounds; round++) {
    for (const fifo of [false, true]) {
      const wrap = (cmd, args) => (fifo ? ['chrt', ['-f', '50', cmd, ...args]] : [cmd, args])
      const pt = await perftest({ test: 'read_lat', size: 8, iters: n, txDepth: 1, device, gidIndex, addr, wrap: fifo ? ['chrt', '-f', '50'] : [] })
      const c = await new Promise((res) => {
        const [cmd, args] = wrap(loop, [device, String(gidIndex), String(n), 'read'])
        const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] })
        let out = ''
        p.stdout.on('data', (d) => { out += d })
        p.on('close', () => res(Number(/verbs-loop read \d+ ([\d.]+)/.exec(out)?.[1])))
      })
      const ours = await runJson(...wrap(process.execPath, [fileURLToPath(import.meta.url), '--child', 'read', String(n)]))
      const tagged = await runJson(...wrap(process.execPath, [fileURLToPath(import.meta.url), '--child', 'tagged-read', String(n)]))
      const ptAtomic = await perftest({ test: 'atomic_fadd_bw', size: 8, iters: n, txDepth: 16, device, gidIndex, addr, wrap: fifo ? ['chrt', '-f', '50'] : [] })
      const oursAtomic = await runJson(...wrap(process.execPath, [fileURLToPath(import.meta.url), '--child', 'fadd', String(n)]))
      const taggedAtomic = await runJson(...wrap(process.execPath, [fileURLToPath(import.meta.url), '--child', 'tagged-fadd', String(n)]))
      const row = { round, fifo, perftestReadAvg: pt.tAvg, perftestReadTypical: pt.tTypical, cLoopRead: c, oursRead: ours.us, oursTaggedRead: tagged.us, perftestAtomicMpps: ptAtomic.mpps, oursAtomicMpps: oursAtomic.mpps, oursTaggedAtomicMpps: taggedAtomic.mpps }
      rows.push(row)
      console.error(`latency: round ${round}${fifo ? ' chrt -f' : ''}: READ ours ${ours.us.toFixed(1)} µs (tagged ${tagged.us.toFixed(1)}), C ${c.toFixed(1)}, ib_read_lat avg ${pt.tAvg} typ ${pt.tTypical}; FETCH_ADD ours ${oursAtomic.mpps.toFixed(4)} Mpps (tagged ${taggedAtomic.mpps.toFixed(4)}), ib_atomic_bw ${ptAtomic.mpps}`)
    }
  }
  console.log('@latency ' + JSON.stringify(rows))
}

export function markdown(rows) {
  const out = ['| scheduling | ib_read_lat t_avg µs | C loop READ µs | ours `await qp.read()` µs | READ ratio ours / ib_read_lat | ours tagged `postRead` + `cq.poll()` µs | its ratio | ib_atomic_bw Mpps | ours fetchAndAdd Mpps | atomic ratio ours / ib_atomic_bw | ours tagged postFetchAndAdd Mpps | its ratio |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for (const fifo of [false, true]) {
    const r = rows.filter((x) => x.fifo === fifo)
    if (!r.length) continue
    const m = (f) => median(r.map(f))
    out.push(`| ${fifo ? 'chrt -f 50' : 'default'} | ${m((x) => x.perftestReadAvg).toFixed(1)} | ${m((x) => x.cLoopRead).toFixed(1)} | ${m((x) => x.oursRead).toFixed(1)} | ${m((x) => x.oursRead / x.perftestReadAvg).toFixed(2)} | ${m((x) => x.oursTaggedRead).toFixed(1)} | ${m((x) => x.oursTaggedRead / x.perftestReadAvg).toFixed(2)} | ${m((x) => x.perftestAtomicMpps).toFixed(4)} | ${m((x) => x.oursAtomicMpps).toFixed(4)} | ${m((x) => x.oursAtomicMpps / x.perftestAtomicMpps).toFixed(2)} | ${m((x) => x.oursTaggedAtomicMpps).toFixed(4)} | ${m((x) => x.oursTaggedAtomicMpps / x.perftestAtomicMpps).toFixed(2)} |`)
  }
  return out.join('\n') + `\n\n(medians over ${rows.length / 2} rounds; ratios are medians of each round's ratio)\n`
}

async function host(argv) {
  const { bootGuest, buildTools, qemuWrapper } = await import('./icount.mjs')
  buildTools()
  const bin = qemuWrapper() // no plugin: only the boot fix (no_timer_check)
  const { code, out } = await bootGuest(fileURLToPath(import.meta.url), argv, bin)
  const line = out.split('\n').find((l) => l.startsWith('@latency '))
  if (!line) {
    process.stdout.write(out)
    throw new Error(`no results from the guest (exit ${code})`)
  }
  process.stdout.write(markdown(JSON.parse(line.slice(9))))
}

export async function main(argv) {
  if (argv[0] === '--child') return child(argv.slice(1))
  if (argv[0] === '--guest') return guest(argv.slice(1))
  return host(argv)
}

runIfMain(import.meta.url, main, 'latency')
