#!/usr/bin/env node
// `npm test`: the type check (lib/ and test/), host-only unit tests, then the RDMA suites with a real device
// (scripts/softroce.sh: native rxe where the kernel has it, else a QEMU guest).
// Under CI=true (or NODE_IBVERBS_REQUIRE_RDMA=1) RDMA suites that cannot run,
// or that skip any test, are a failure; a plain developer run skips them with
// a loud message. The verdict is in scripts/test-verdict.mjs.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { verdict } from './test-verdict.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const requireRdma = process.env.CI === 'true' || process.env.NODE_IBVERBS_REQUIRE_RDMA === '1'
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

const vitest = join(root, 'node_modules', '.bin', 'vitest')
const tsc = join(root, 'node_modules', '.bin', 'tsc')
console.log('== type check ==')
// `npm run typecheck`: lib/ as the build compiles it, then the tests (tsconfig.test.json;
// vitest only strips their types). Any error fails the run before the suites start.
for (const args of [['-p', 'tsconfig.json', '--noEmit'], ['-p', 'tsconfig.test.json']]) {
  const checked = await run(tsc, args)
  if (checked.code !== 0) {
    console.log(`\ntype check failed: tsc ${args.join(' ')} (exit ${checked.code}); the suites did not run`)
    process.exit(1)
  }
}
console.log('no type errors (lib/ and test/)')

console.log('\n== unit tests (host) ==')
const unit = await run(vitest, ['run', '--config', 'vitest.unit.config.ts', ...extra])

console.log('\n== RDMA suites (real device via scripts/softroce.sh) ==')
// 10 GiB for the guest (SR_MEMORY overrides, in MB):
// test/rdma/25.large-memory.test.ts registers two regions of 4 GiB + 1 MiB (a
// real transfer of more than 4 GiB), test/rdma/105.transfer-scale.test.ts
// one of 4 GiB + 256 MiB (the engine's blocks past 2^32; freed before or
// after 25's, never with them). A QEMU guest only takes from the host the
// memory it touches.
const rdmaMemory = process.env.SR_MEMORY || '10240'
const rdma = await run('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--memory', rdmaMemory, '--', vitest, 'run', '--config', 'vitest.rdma.config.ts', ...extra])

console.log('\n== two-host suite (two guests joined by a virtual wire) ==')
// Both guests run the suite and print a summary (tagged [host0], [host1]): both count.
const twoHost = await run('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--topology', 'two-host', '--', vitest, 'run', '--config', 'vitest.two-host.config.ts'])

const result = verdict({ unit, rdma, twoHost, requireRdma })
for (const message of result.messages) console.log(message.startsWith('!') ? message : `\n${message}`)
console.log(`\n${result.summary.join('\n')}`)
process.exit(result.failed ? 1 : 0)
