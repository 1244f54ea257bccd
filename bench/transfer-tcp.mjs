#!/usr/bin/env node
// The transfer engine over TCP against a plain node:net socket moving the
// same bytes on loopback (lib/cli/bench-net.ts), in the same process,
// interleaved: each round runs, per op and block size, the plain socket, then
// the engine (two TCP agents, random non-contiguous blocks, every block
// checked) with 1 and 2 lanes. With --rdma (on a machine with a device, e.g.
// the Soft-RoCE guest), the RDMA engine moves the same blocks in the same
// round. Ratios are per round; the table shows their median. Writes
// bench/results/transfer-tcp-<time>/{results.json,results.md} and prints the
// Markdown.
//
//   node bench/transfer-tcp.mjs                       (host: no device needed)
//   bash scripts/softroce.sh run -- node bench/transfer-tcp.mjs --rdma
//
// Options: --rounds N (5), --mib N (64: bytes per transfer), --sizes 65536,16384,4096,
//   --qps 1,2, --ops write,read, --rdma, --out DIR, --quiet, --help.
import { mkdirSync, writeFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { execSync } from 'node:child_process'
import { commonOption } from './entry.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const MiB = 1 << 20

function parseArgs(argv) {
  const o = { rounds: 5, mib: 64, sizes: [65536, 16384, 4096], qps: [1, 2], ops: ['write', 'read'], rdma: false, out: undefined, quiet: false }
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
      case '--rdma': o.rdma = true; break
      default: commonOption(o, a, val, import.meta.url, 16) // --out, --from-log, --quiet, --help
    }
  }
  return o
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const n = s.length; return n === 0 ? NaN : n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2 }
const fmt = (v, d = 2) => (v === undefined || Number.isNaN(v) ? '–' : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(d))
const sizeName = (n) => (n >= MiB ? `${n / MiB} MiB` : n >= 1024 ? `${n / 1024} KiB` : `${n} B`)
const load = () => loadavg().map((l) => l.toFixed(1)).join(' ')

const opts = parseArgs(process.argv.slice(2))
const { TransferBench } = await import('../dist/cli/bench-transfer.js')
const log = (s) => { if (!opts.quiet) process.stderr.write(s + '\n') }
const tcp = await TransferBench.open({ transport: 'tcp', maxBytes: opts.mib * MiB })
const rdma = opts.rdma ? await TransferBench.open({ maxBytes: opts.mib * MiB }) : undefined
const rows = new Map()
const rowFor = (op, size, qps) => {
  const key = `${op}|${size}|${qps}`
  if (!rows.has(key)) rows.set(key, { op, size, blocks: (opts.mib * MiB) / size, qps, net: [], tcp: [], rdma: [], ratios: [], rdmaRatios: [], netCpu: [], tcpCpu: [], cpuRatios: [] })
  return rows.get(key)
}
const loads = [load()]
log(`transfer-tcp bench: ${opts.mib} MiB per transfer, sizes ${opts.sizes.join(',')}, lanes ${opts.qps.join(',')}, ${opts.ops.join(',')}, ${opts.rounds} rounds${rdma ? `, RDMA on ${rdma.target.device.name}` : ''}; load average ${load()}`)
try {
  for (let round = 1; round <= opts.rounds; round++) {
    for (const op of opts.ops) {
      for (const size of opts.sizes) {
        const blocks = (opts.mib * MiB) / size
        // The runs of a size in an order that rotates with the round (what runs after what does not favour one of them).
        const runs = [undefined, ...opts.qps]
        const order = runs.map((_, i) => runs[(i + round) % runs.length])
        const results = new Map()
        for (const qps of order) {
          if (qps === undefined) results.set('net', await tcp.plainNet({ op, blocks, blockSize: size, qps: opts.qps[0] }))
          else results.set(qps, await tcp.run({ op, blocks, blockSize: size, qps }))
        }
        const net = results.get('net')
        for (const qps of opts.qps) {
          const row = rowFor(op, size, qps)
          const ours = results.get(qps)
          row.net.push(net.mbPerSec)
          row.tcp.push(ours.mbPerSec)
          row.ratios.push(ours.mbPerSec / net.mbPerSec)
          // MB per CPU second of the process (both ends): what each costs, whatever else the machine runs.
          const perCpu = (r) => r.bytes / MiB / r.cpuSeconds
          row.netCpu.push(perCpu(net))
          row.tcpCpu.push(perCpu(ours))
          row.cpuRatios.push(perCpu(ours) / perCpu(net))
          let line = `  [r${round}] ${op} ${blocks} x ${sizeName(size)} lanes ${qps}: tcp ${fmt(ours.mbPerSec)} MB/s (${fmt(ours.cpuSeconds * 1000)} ms CPU) | net ${fmt(net.mbPerSec)} MB/s (${fmt(net.cpuSeconds * 1000)} ms CPU)`
          if (rdma) {
            const r = await rdma.run({ op, blocks, blockSize: size, qps })
            row.rdma.push(r.mbPerSec)
            row.rdmaRatios.push(ours.mbPerSec / r.mbPerSec)
            line += ` | rdma ${fmt(r.mbPerSec)} MB/s`
          }
          log(line)
        }
      }
    }
    loads.push(load())
  }
} finally {
  tcp.close()
  rdma?.close()
}

let commit = 'unknown'
try { commit = execSync('git rev-parse --short HEAD', { cwd: root }).toString().trim() } catch { /* not a checkout */ }
const date = new Date().toISOString().slice(0, 10)
const header = ['op', 'blocks', 'lanes', 'TCP engine MB/s', 'plain node:net MB/s', 'engine / net', 'engine MB per CPU s', 'net MB per CPU s', 'engine / net (CPU)', ...(rdma ? ['RDMA engine MB/s', 'TCP / RDMA'] : [])]
const lines = [`| ${header.join(' | ')} |`, `|${header.map(() => '---').join('|')}|`]
for (const r of rows.values()) {
  lines.push(`| ${r.op} | ${r.blocks} x ${sizeName(r.size)} | ${r.qps} | ${fmt(median(r.tcp))} | ${fmt(median(r.net))} | ${fmt(median(r.ratios))} | ${fmt(median(r.tcpCpu))} | ${fmt(median(r.netCpu))} | ${fmt(median(r.cpuRatios))} |${rdma ? ` ${fmt(median(r.rdma))} | ${fmt(median(r.rdmaRatios))} |` : ''}`)
}
const md = `${date}, commit ${commit}, ${opts.rounds} rounds (medians; ratio per round), ${opts.mib} MiB per transfer, load average ${loads.join(' → ')}\n\n${lines.join('\n')}\n`
const out = opts.out ?? join(root, 'bench', 'results', `transfer-tcp-${new Date().toISOString().replace(/[:.]/g, '-')}`)
mkdirSync(out, { recursive: true })
writeFileSync(join(out, 'results.json'), JSON.stringify({ date, commit, opts, loads, rows: [...rows.values()] }, null, 2))
writeFileSync(join(out, 'results.md'), md)
console.log(md)
