#!/usr/bin/env node
// `npm run test:asan`: the RDMA suites against an AddressSanitizer +
// UndefinedBehaviorSanitizer build of the addon. Passing means vitest passed
// AND no sanitizer report appeared anywhere (output or report files).
//
// 1. Builds the addon with -fsanitize=address,undefined -fno-sanitize-recover=all
//    into build/asan/ (a gyp file that includes ../../binding.gyp), so the
//    normal build/Release stays untouched.
// 2. Runs itself with --in-rdma-env through scripts/softroce.sh (a real device,
//    natively or in the QEMU guest). There it runs vitest with libasan
//    preloaded into Node (an uninstrumented Node must load the ASan runtime
//    first) and NODE_IBVERBS_ADDON pointing lib/native/addon.ts at the ASan build.
//
// Options: --no-build reuses build/asan, --build-only stops after the build;
// other arguments go to vitest
// (e.g. a test file). Exit 0 only on a clean, non-empty, passing run.
import { spawn, spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const buildDir = join(root, 'build', 'asan')
const addon = join(buildDir, 'build', 'Release', 'node_ibverbs.node')
const ENV_UNAVAILABLE = 201
const SANITIZE = ['-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g']
// Any of these in the output is a sanitizer report, whatever vitest says.
const REPORT = /ERROR: AddressSanitizer|ERROR: LeakSanitizer|AddressSanitizer:DEADLYSIGNAL|SUMMARY: (Address|UndefinedBehavior)Sanitizer|runtime error: |UndefinedBehaviorSanitizer/

const args = process.argv.slice(2)
const inRdmaEnv = args[0] === '--in-rdma-env'
const noBuild = args.includes('--no-build')
const buildOnly = args.includes('--build-only')
const vitestArgs = args.filter((a) => !['--in-rdma-env', '--no-build', '--build-only'].includes(a))

/** Runs a command, echoing and collecting stdout and stderr. */
function run(command, argv, env = process.env) {
  return new Promise((resolve) => {
    const child = spawn(command, argv, { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] })
    let text = ''
    child.stdout.on('data', (chunk) => { process.stdout.write(chunk); text += chunk })
    child.stderr.on('data', (chunk) => { process.stderr.write(chunk); text += chunk })
    child.on('close', (code, signal) => resolve({ code: code ?? 128, signal, text }))
  })
}

/** vitest's summary line, e.g. "Tests  2 failed | 40 passed (42)". */
function counts(text) {
  const line = text.replace(/\x1b\[[0-9;]*m/g, '').split('\n').filter((l) => /^\s*Tests\s/.test(l)).pop() ?? ''
  const n = (word) => Number(line.match(new RegExp(`(\\d+) ${word}`))?.[1] ?? 0)
  return { passed: n('passed'), failed: n('failed') }
}

function sanitizerLib(name) {
  const out = spawnSync('gcc', [`-print-file-name=${name}`], { encoding: 'utf8' })
  const path = out.stdout?.trim()
  if (out.status !== 0 || !path || !path.startsWith('/') || !existsSync(path)) {
    console.error(`test:asan: ${name} not found (gcc -print-file-name=${name}); install gcc (it ships the sanitizer runtimes)`)
    process.exit(1)
  }
  return path
}

function build() {
  mkdirSync(buildDir, { recursive: true })
  // gyp rebases the included file's paths (sources) onto this directory;
  // target_defaults adds the sanitizer flags to every target.
  const gyp = {
    includes: ['../../binding.gyp'],
    target_defaults: { cflags: SANITIZE, cflags_cc: SANITIZE, ldflags: SANITIZE },
  }
  writeFileSync(join(buildDir, 'binding.gyp'), JSON.stringify(gyp, null, 2) + '\n')
  // Through npm, like `npm run build:native`: node-gyp then sees npm's config (nodedir, ...).
  const result = spawnSync('npm', ['exec', '--', 'node-gyp', 'rebuild', '--directory', buildDir], { cwd: root, stdio: 'inherit' })
  if (result.status !== 0) {
    console.error('test:asan: the sanitizer build failed')
    process.exit(1)
  }
}

/** Inside the RDMA environment: vitest under the sanitizers, then look for reports. */
async function runSanitized() {
  const reports = mkdtempSync(join(tmpdir(), 'node-ibverbs-asan-'))
  const env = {
    ...process.env,
    NODE_IBVERBS_ADDON: addon,
    LD_PRELOAD: [sanitizerLib('libasan.so'), process.env.LD_PRELOAD].filter(Boolean).join(':'),
    // V8 never frees some memory by design: leak reports would be noise.
    // allocator_may_return_null: a huge allocation is a coded ENOMEM, not an abort.
    ASAN_OPTIONS: `detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:allocator_may_return_null=1:log_path=${reports}/asan`,
    UBSAN_OPTIONS: `halt_on_error=1:print_stacktrace=1:exitcode=87:log_path=${reports}/ubsan`,
    // 97.consumer's installed copy loads this build (NODE_IBVERBS_ADDON) rather than its prebuild.
    NODE_IBVERBS_SANITIZED: '1',
    // 112-114 are left out of `npm test` (vitest.rdma.config.ts); their native paths run here:
    // thousands of objects created and closed, 2000 CQs on one channel fd, refusals past the limits
    // (112); four worker threads moving data at once and terminated with requests in flight (113);
    // fork() and spawned children while traffic flows (114). 113 and 114 add ~120 s of tests.
    NODE_IBVERBS_RDMA_WITH: '112.exhaustion,113.workers,114.fork',
    // Smaller sizes, the same native paths (a caller's own values win):
    // 101's resume: a 256 MiB write cut and resumed (4096 blocks of 64 KiB), not 1 GiB: the same
    // cut, landed bitmap and resend, a quarter of the bytes to hash in JS.
    RESUME_MIB: process.env.RESUME_MIB ?? '256',
    // 120's campaign: 8 client processes x 50 rounds on 4 locks, not 500 (380 s without the
    // sanitizers; 100 rounds took 363 s here on a starved guest): the same CAS/FETCH_ADD/READ/WRITE
    // paths, contended, and exactness checked; a tenth of the rounds.
    NODE_IBVERBS_LOCK_ROUNDS: process.env.NODE_IBVERBS_LOCK_ROUNDS ?? '50',
  }
  const vitest = join(root, 'node_modules', '.bin', 'vitest')
  // 25.large-memory needs a 10 GiB guest and spends minutes filling and
  // checking bytes in JS: `npm test` runs it; its native paths (views past
  // 4 GiB, splitting) are small and covered here by the other files. Every
  // other RDMA file of `npm test` runs here, and 112-114 too (env above).
  // 108.kv-cluster (five sanitized Node processes and etcd) gives the example
  // 400 s per step here (NODE_IBVERBS_SANITIZED): an agent took over 120 s to
  // start on a starved guest.
  const excluded = ['25.large-memory']
  const config = vitestArgs.some((x) => x === '--config' || x === '-c' || x.startsWith('--config='))
    ? []
    : ['--config', 'vitest.rdma.config.ts', ...excluded.flatMap((name) => ['--exclude', `**/${name}.test.ts`])]
  const result = await run(vitest, ['run', ...config, ...vitestArgs], env)
  // Report files can also hold warnings (e.g. "failed to allocate" when a huge
  // allocation returns NULL, as allocator_may_return_null asks): only errors count.
  const files = readdirSync(reports).filter((file) => REPORT.test(readFileSync(join(reports, file), 'utf8')))
  for (const file of readdirSync(reports)) {
    console.error(`\n== sanitizer report ${file} ==`)
    console.error(readFileSync(join(reports, file), 'utf8'))
  }
  rmSync(reports, { recursive: true, force: true })
  const { passed } = counts(result.text)
  const inOutput = REPORT.test(result.text)
  if (files.length > 0 || inOutput) {
    console.error(`test:asan: ${files.length} sanitizer report file(s)${inOutput ? ', a report in the output' : ''}: FAILED`)
    process.exit(1)
  }
  if (result.code !== 0) {
    // A worker killed without a report (the OOM killer, a signal): the kernel says which.
    const kernel = spawnSync('dmesg', [], { encoding: 'utf8' }).stdout ?? ''
    const lines = kernel.split('\n').filter((l) => /out of memory|killed process|segfault|oom/i.test(l))
    if (lines.length > 0) console.error(`test:asan: kernel messages:\n${lines.slice(-10).join('\n')}`)
    process.exit(result.code)
  }
  if (passed === 0) {
    console.error('test:asan: vitest ran no test: that is a failure')
    process.exit(1)
  }
  console.log(`test:asan: ${passed} tests passed, no sanitizer report`)
}

if (inRdmaEnv) {
  await runSanitized()
} else {
  const started = Date.now()
  if (!noBuild || !existsSync(addon)) build()
  if (buildOnly) process.exit(0)
  const requireRdma = process.env.CI === 'true' || process.env.NODE_IBVERBS_REQUIRE_RDMA === '1'
  // More guest memory than the default: ASan's shadow memory and quarantine need room, and
  // 105.transfer-scale registers 4.25 GiB (segments past 2^32; mmap'd, outside ASan's heap) and
  // wants 5.75 GiB free. A guest only takes from the host the memory it touches.
  // Every RDMA file but two, under the sanitizers, can outlast the guest's default bound (3600 s) on
  // a slow or shared machine: the bound is CI's own limit, 90 minutes.
  const result = await run('bash', [join(root, 'scripts', 'softroce.sh'), 'run', '--memory', '8192', '--timeout', '5400', '--',
    process.execPath, join(root, 'scripts', 'test-asan.mjs'), '--in-rdma-env', ...vitestArgs])
  const seconds = ((Date.now() - started) / 1000).toFixed(0)
  if (result.code === ENV_UNAVAILABLE && !requireRdma) {
    console.log('!! test:asan SKIPPED: no RDMA device could be provided (see above); NOT counted as passed')
    process.exit(0)
  }
  // The output streamed out of the guest is checked again here.
  if (REPORT.test(result.text)) {
    console.error(`test:asan: a sanitizer report appeared in the output: FAILED (${seconds} s)`)
    process.exit(1)
  }
  console.log(`test:asan: exit ${result.code} after ${seconds} s (build and run)`)
  process.exit(result.code)
}
