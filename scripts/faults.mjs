#!/usr/bin/env node
// `npm run test:faults`: the whole two-host fault campaign of issue 11
// (test/two-host/faults/campaign.ts) in one boot of the two-host topology.
// The campaign is bundled here (esbuild, from vitest's dependencies) and run
// with plain node in both guests: starting vitest in a busy guest can take
// longer than vitest's own worker timeout.
// Streams the guests' output, then prints every FAULT-FIGURE row and writes
// them to bench/results/faults-figures.json (or the path in FAULTS_FIGURES) for docs/reliability.md.
// FAULTS_BYTES sets the size of the WRITE/READ under each netem setting (default 64 MiB);
// FAULTS_ONLY=netem runs only the netem rounds, FAULTS_ONLY=quick all but them;
// FAULTS_SETTINGS='clean wire,loss 1%' only those netem settings; FAULTS_NETEM_READ=0 no READ in them.
import { spawn } from 'node:child_process'
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { table } from './faults-table.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
mkdirSync(join(root, 'bench', 'results'), { recursive: true })
const bundle = join(root, 'bench', 'results', 'faults-campaign.mjs')
const { build } = await import('esbuild')
await build({
  entryPoints: [join(root, 'test', 'two-host', 'faults', 'campaign.ts')],
  outfile: bundle, bundle: true, format: 'esm', platform: 'node', target: 'node20', logLevel: 'warning',
  // The library itself stays outside the bundle (it finds its native addon next to dist/).
  plugins: [{ name: 'library', setup: (b) => b.onResolve({ filter: /\/dist\/index\.js$/ }, () => ({ path: 'node-ibverbs', external: true })) }],
})
// The peer processes the campaign kills and restarts, next to the bundle (they are found relative to it).
for (const peer of ['peer-server.mjs', 'transfer-peer.mjs']) copyFileSync(join(root, 'test', 'two-host', 'faults', peer), join(root, 'bench', 'results', peer))
const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--topology', 'two-host', '--timeout', '5400', '--',
  process.execPath, bundle], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] })
let text = ''
child.stdout.on('data', (chunk) => { process.stdout.write(chunk); text += chunk })
const code = await new Promise((resolve) => child.on('close', (c) => resolve(c ?? 1)))

const rows = text.split('\n').flatMap((line) => {
  const at = line.indexOf('FAULT-FIGURE ')
  if (at < 0) return []
  try { return [JSON.parse(line.slice(at + 'FAULT-FIGURE '.length))] } catch { return [] }
})
const out = process.env.FAULTS_FIGURES || join(root, 'bench', 'results', 'faults-figures.json')
writeFileSync(out, `${JSON.stringify(rows, null, 1)}\n`)
console.log(`\n== fault campaign: ${rows.length} figure rows (${out}) ==`)
for (const row of rows) console.log(`host ${row.host} | ${row.fault} | ${JSON.stringify(row, (key, value) => (key === 'host' || key === 'fault' || key === 'lostSeqs' || key === 'settled' ? undefined : value))}`)
console.log(`\n${table(rows)}`)
process.exit(code)
