#!/usr/bin/env node
// `npm run test:faults`: the whole two-host fault campaign of issue 11
// (test/two-host/31.fault-campaign.ts) in one boot of the two-host topology.
// Streams the guests' output, then prints every FAULT-FIGURE row and writes
// them to bench/results/faults-figures.json (or the path in FAULTS_FIGURES) for docs/reliability.md.
// FAULTS_BYTES sets the size of the WRITE/READ under each netem setting (default 64 MiB).
import { spawn } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const vitest = join(root, 'node_modules', '.bin', 'vitest')
const child = spawn('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--topology', 'two-host', '--timeout', '5400', '--',
  vitest, 'run', '--config', 'vitest.faults.config.ts'], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] })
let text = ''
child.stdout.on('data', (chunk) => { process.stdout.write(chunk); text += chunk })
const code = await new Promise((resolve) => child.on('close', (c) => resolve(c ?? 1)))

const rows = text.split('\n').flatMap((line) => {
  const at = line.indexOf('FAULT-FIGURE ')
  if (at < 0) return []
  try { return [JSON.parse(line.slice(at + 'FAULT-FIGURE '.length))] } catch { return [] }
})
mkdirSync(join(root, 'bench', 'results'), { recursive: true })
const out = process.env.FAULTS_FIGURES || join(root, 'bench', 'results', 'faults-figures.json')
writeFileSync(out, `${JSON.stringify(rows, null, 1)}\n`)
console.log(`\n== fault campaign: ${rows.length} figure rows (${out}) ==`)
for (const row of rows) console.log(`host ${row.host} | ${row.fault} | ${JSON.stringify(row, (key, value) => (key === 'host' || key === 'fault' || key === 'lostSeqs' || key === 'settled' ? undefined : value))}`)
process.exit(code)
