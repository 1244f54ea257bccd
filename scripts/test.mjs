#!/usr/bin/env node
// `npm test`: host-only unit tests, then the RDMA suites with a real device
// (scripts/softroce.sh: native rxe where the kernel has it, else a QEMU guest).
// Under CI=true (or NODE_IBVERBS_REQUIRE_RDMA=1) RDMA suites that cannot run
// are a failure; a plain developer run skips them with a loud message.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const requireRdma = process.env.CI === 'true' || process.env.NODE_IBVERBS_REQUIRE_RDMA === '1'
const ENV_UNAVAILABLE = 201
const extra = process.argv.slice(2)

function run(command, args) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] })
    let text = ''
    child.stdout.on('data', (chunk) => {
      process.stdout.write(chunk)
      text += chunk
    })
    child.on('close', (code, signal) => resolve({ code: code ?? 128, signal, text }))
  })
}

// vitest's summary line, e.g. "Tests  2 failed | 40 passed | 1 skipped (43)".
function counts(text) {
  const line = text.replace(/\x1b\[[0-9;]*m/g, '').split('\n').filter((l) => /^\s*Tests\s/.test(l)).pop() ?? ''
  const n = (word) => Number(line.match(new RegExp(`(\\d+) ${word}`))?.[1] ?? 0)
  return { passed: n('passed'), failed: n('failed'), skipped: n('skipped') }
}

const vitest = join(root, 'node_modules', '.bin', 'vitest')
console.log('== unit tests (host) ==')
const unit = await run(vitest, ['run', '--config', 'vitest.unit.config.ts', ...extra])
const unitCounts = counts(unit.text)

console.log('\n== RDMA suites (real device via scripts/softroce.sh) ==')
// 10 GiB for the guest (SR_MEMORY overrides, in MB):
// test/rdma/25.large-memory.test.ts registers two regions of 4 GiB + 1 MiB (a
// real transfer of more than 4 GiB). A QEMU guest only takes from the host the
// memory it touches.
const rdmaMemory = process.env.SR_MEMORY || '10240'
const rdma = await run('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--memory', rdmaMemory, '--', vitest, 'run', '--config', 'vitest.rdma.config.ts', ...extra])
const rdmaCounts = counts(rdma.text)

console.log('\n== two-host suite (two guests joined by a virtual wire) ==')
const twoHost = await run('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--topology', 'two-host', '--', vitest, 'run', '--config', 'vitest.two-host.config.ts'])
// Both guests print a summary; count host 1's (the client) as the suite's.
const twoHostCounts = counts(twoHost.text.split('\n').filter((l) => l.startsWith('[host1]')).map((l) => l.slice(8)).join('\n'))

let failed = unit.code !== 0
if (rdma.code === ENV_UNAVAILABLE && !requireRdma) {
  console.log('\n' + '!'.repeat(72))
  console.log('!! RDMA suites SKIPPED: no RDMA device could be provided (see above).')
  console.log('!! They are NOT counted as passed. Fix: sudo bash scripts/softroce.sh provision')
  console.log('!'.repeat(72))
} else if (rdma.code !== 0) {
  failed = true
  console.log(`\nRDMA suites failed (exit ${rdma.code}${rdma.code >= 201 && rdma.code <= 204 ? ': the Soft-RoCE environment could not run them' : ''})`)
} else if (rdmaCounts.passed === 0) {
  failed = true
  console.log('\nRDMA suites ran no test: that is a failure')
}
if (twoHost.code === ENV_UNAVAILABLE && !requireRdma) {
  console.log('!! two-host suite SKIPPED (no QEMU environment); NOT counted as passed')
} else if (twoHost.code !== 0) {
  failed = true
  console.log(`\ntwo-host suite failed (exit ${twoHost.code})`)
} else if (twoHostCounts.passed === 0) {
  failed = true
  console.log('\ntwo-host suite ran no test: that is a failure')
}

const passed = unitCounts.passed + rdmaCounts.passed + twoHostCounts.passed
const counted = unitCounts.failed + rdmaCounts.failed + twoHostCounts.failed
const failedCount = counted + (failed && counted === 0 ? 1 : 0)
console.log(`\nunit: ${unitCounts.passed} passed, ${unitCounts.failed} failed; rdma: ${rdmaCounts.passed} passed, ${rdmaCounts.failed} failed; two-host: ${twoHostCounts.passed} passed, ${twoHostCounts.failed} failed`)
console.log(`${passed} passed, ${failedCount} failed`)
process.exit(failed ? 1 : 0)
