// The package as a consumer gets it, made as a release makes it: a fresh git
// clone of this checkout's HEAD, `npm ci` there, the x64 prebuild (the one
// `npm run release:prebuilds` makes), then `npm pack` with its lifecycle
// scripts (prepack builds dist/). The tarball is installed into a fresh project
// with install scripts disabled and no compiler on PATH (as pnpm,
// `npm install --ignore-scripts` or a slim container would), a strict
// TypeScript consumer is type-checked against it, and the prebuilt binary is
// loaded. The installed project is left in build/consumer for test/rdma/97,
// which runs the consumer with a real device (the RDMA phase of `npm test`
// comes after this one). The clone packs committed code only: uncommitted
// changes are not in the tarball (the test says so when there are some).
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawn, spawnSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { missingEntries, parsePackJson } from '../../scripts/packed-entries.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const consumer = join(root, 'build', 'consumer')
const packDir = join(root, 'build', 'pack')
// A PATH with node and npm and nothing else: no cc, g++, make, python3.
const toolless = join(root, 'build', 'consumer-bin')
const prebuildPath = join('prebuilds', `linux-${process.arch}`, 'node-ibverbs.glibc.node')
const prebuild = join(root, prebuildPath)
// The fresh clone the tarball is packed from (removed at the end).
const clone = mkdtempSync(join(tmpdir(), 'node-ibverbs-release-'))

interface PackResult { filename: string; size: number; unpackedSize: number; entryCount: number; files: Array<{ path: string }> }
let pack: PackResult
interface Ran { status: number | null; stdout: string; stderr: string }
let install: Ran
let clonePkg: Record<string, unknown>

/** Runs a command without blocking the test worker (npm and tsc take a while on a busy machine). */
function sh(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = process.env): Promise<Ran> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'], timeout: 240_000 })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => { stdout += chunk })
    child.stderr.on('data', (chunk) => { stderr += chunk })
    child.on('error', (error) => resolve({ status: null, stdout, stderr: `${stderr}${error.message}` }))
    child.on('close', (status) => resolve({ status, stdout, stderr }))
  })
}

beforeAll(async () => {
  for (const dir of [consumer, packDir, toolless]) rmSync(dir, { recursive: true, force: true })
  mkdirSync(packDir, { recursive: true })
  mkdirSync(toolless, { recursive: true })

  // The x64 prebuild is the build CI just made (binding.gyp builds every
  // binary with the prebuilds' flags), stripped as prebuildify --strip does.
  // npm run release:prebuilds makes both architectures the same way.
  const built = join(root, 'build', 'Release', 'node_ibverbs.node')
  if (!existsSync(built)) throw new Error('build/Release/node_ibverbs.node is missing: npm run build first')
  mkdirSync(dirname(prebuild), { recursive: true })
  copyFileSync(built, prebuild)
  const strip = await sh('strip', ['--strip-all', prebuild], root)
  if (strip.status !== 0) throw new Error(`strip failed: ${strip.stderr}`)

  const npmCli = realpathSync((await sh('sh', ['-c', 'command -v npm'], root)).stdout.trim())
  symlinkSync(process.execPath, join(toolless, 'node'))
  symlinkSync(npmCli, join(toolless, 'npm')) // its #!/usr/bin/env node finds the node above

  // The release steps on a fresh clone: git clone, npm ci (the prebuild is in
  // place first, so its install step compiles nothing), npm pack.
  const head = (await sh('git', ['rev-parse', '--short', 'HEAD'], root)).stdout.trim()
  const dirty = (await sh('git', ['status', '--porcelain', '--untracked-files=no'], root)).stdout.trim()
  if (dirty) console.warn(`consumer test: packing the committed HEAD (${head}); uncommitted changes are not in the tarball:\n${dirty}`)
  const cloned = await sh('git', ['clone', '--quiet', root, clone], root)
  if (cloned.status !== 0) throw new Error(`git clone failed: ${cloned.stderr}`)
  mkdirSync(dirname(join(clone, prebuildPath)), { recursive: true })
  copyFileSync(prebuild, join(clone, prebuildPath))
  const env = { ...process.env }
  delete env.NODE_IBVERBS_ADDON
  for (const key of Object.keys(env)) if (key.startsWith('npm_')) delete env[key] // not the outer npm run's settings
  const started = Date.now()
  const ci = await sh(process.execPath, [npmCli, 'ci', '--prefer-offline', '--no-audit', '--no-fund'], clone, env)
  if (ci.status !== 0) throw new Error(`npm ci in the clone failed: ${ci.stdout}\n${ci.stderr}`)
  const packed = await sh(process.execPath, [npmCli, 'pack', '--json', '--pack-destination', packDir], clone, env)
  if (packed.status !== 0) throw new Error(`npm pack in the clone failed: ${packed.stdout}\n${packed.stderr}`)
  console.log(`fresh clone of ${head}: npm ci + npm pack took ${((Date.now() - started) / 1000).toFixed(1)} s`)
  pack = parsePackJson(packed.stdout)[0]
  clonePkg = JSON.parse(readFileSync(join(clone, 'package.json'), 'utf8'))

  mkdirSync(consumer, { recursive: true })
  writeFileSync(join(consumer, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }, null, 2))
  copyFileSync(join(root, 'test', 'consumer', 'consumer.ts'), join(consumer, 'consumer.ts'))
  copyFileSync(join(root, 'test', 'consumer', 'tsconfig.json'), join(consumer, 'tsconfig.json'))
  const typesNode = JSON.parse(readFileSync(join(root, 'node_modules', '@types', 'node', 'package.json'), 'utf8')).version
  install = await sh(join(toolless, 'npm'), ['install', '--ignore-scripts', '--no-audit', '--no-fund', '--prefer-offline',
    join(packDir, pack.filename), `@types/node@${typesNode}`], consumer, { ...process.env, PATH: toolless })
}, 600_000)

// The clone holds its own node_modules: removing it took more than the default 10 s on a loaded host.
afterAll(() => rm(clone, { recursive: true, force: true }), 120_000)

describe('the packed tarball', () => {
  it('holds every file package.json names: main, types, exports, bin', () => {
    expect(missingEntries(clonePkg, pack.files.map((f) => f.path))).toEqual([])
  })

  it('the entry check finds a missing main, types, exports target (conditions, patterns) and bin', () => {
    const pkg = {
      main: './lib/a.js', types: 'lib/a.d.ts', bin: './bin/x.js',
      exports: { '.': { types: './lib/a.d.ts', default: './lib/a.js' }, './sub/*': './lib/sub/*.js', './gone': null },
    }
    expect(missingEntries(pkg, ['lib/a.js', 'lib/a.d.ts', 'bin/x.js', 'lib/sub/one.js'])).toEqual([])
    expect(missingEntries(pkg, ['lib/a.js', 'lib/sub/one.js'])).toEqual(['bin/x.js', 'lib/a.d.ts'])
    expect(missingEntries(pkg, ['lib/a.js', 'lib/a.d.ts', 'bin/x.js', 'lib/sub/.js'])).toEqual(['lib/sub/*.js'])
    expect(missingEntries({ bin: { a: './a.js', b: 'b.js' } }, ['a.js'])).toEqual(['b.js'])
  })

  it('holds the runtime, the prebuild, the sources for a rebuild, docs and LICENSE; no maps or dev scripts', () => {
    const files = pack.files.map((f) => f.path)
    for (const file of ['package.json', 'LICENSE', 'README.md', 'docs/api.md', 'dist/index.js', 'dist/index.d.ts',
      'dist/cli/main.js', 'binding.gyp', 'native/core/addon.cc', 'scripts/install.mjs', 'scripts/softroce.sh',
      `prebuilds/linux-${process.arch}/node-ibverbs.glibc.node`]) {
      expect(files, file).toContain(file)
    }
    expect(files.filter((f) => f.endsWith('.map'))).toEqual([])
    for (const file of ['scripts/demo.sh', 'scripts/test.mjs', 'scripts/test-asan.mjs', 'scripts/test-verdict.mjs']) {
      expect(files, file).not.toContain(file)
    }
    expect(files.some((f) => f.startsWith('test/') || f.startsWith('build/') || f.startsWith('bench/'))).toBe(false)
    console.log(`tarball ${pack.filename}: ${pack.size} bytes packed, ${pack.unpackedSize} unpacked, ${pack.entryCount} files`)
  })

  it('declares its metadata: os, exports of package.json, engines, no prepare for consumers', () => {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
    expect(pkg.os).toEqual(['linux'])
    expect(pkg.exports['./package.json']).toBe('./package.json')
    expect(pkg.engines.node).toBe('>=20.19.0')
    expect(pkg.license).toBe('MIT')
    // No `prepare` (it would be listed, and refused, under npm's --strict-allow-scripts, and
    // would run for git installs); a checkout builds with `npm run build`. `install` needs
    // no devDependency.
    expect(pkg.scripts.prepare).toBeUndefined()
    expect(pkg.scripts.install).toBe('node scripts/install.mjs')
  })
})

describe('a consumer project', () => {
  it('has no compiler on the PATH it installs with', () => {
    for (const tool of ['cc', 'gcc', 'g++', 'c++', 'make', 'python3']) {
      const found = spawnSync('/bin/sh', ['-c', `command -v ${tool}`], { env: { PATH: toolless }, encoding: 'utf8' })
      expect(found.stdout.trim(), tool).toBe('')
    }
  })

  it('installs the tarball with --ignore-scripts: nothing compiles, the prebuild is there', () => {
    expect(install.status, `${install.stdout}\n${install.stderr}`).toBe(0)
    const installed = join(consumer, 'node_modules', 'node-ibverbs')
    expect(existsSync(join(installed, 'dist', 'index.js'))).toBe(true)
    expect(existsSync(join(installed, 'build'))).toBe(false)
    expect(existsSync(join(installed, `prebuilds/linux-${process.arch}/node-ibverbs.glibc.node`))).toBe(true)
  })

  it('type-checks under --strict against the installed .d.ts (and emits the JS it runs)', async () => {
    const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc')
    const out = await sh(process.execPath, [tsc, '-p', join(consumer, 'tsconfig.json')], consumer)
    expect(out.status, out.stdout + out.stderr).toBe(0)
    expect(existsSync(join(consumer, 'out', 'consumer.js'))).toBe(true)
  }, 240_000)

  it('loads the prebuilt binary through the installed copy', async () => {
    // LD_BIND_NOW: every symbol the binary needs is resolved at load, not on first call.
    const env: NodeJS.ProcessEnv = { ...process.env, PATH: toolless, LD_BIND_NOW: '1' }
    delete env.NODE_IBVERBS_ADDON
    const probe = await sh(process.execPath, [join(consumer, 'out', 'consumer.js'), 'probe'], consumer, env)
    expect(probe.status, probe.stderr).toBe(0)
    expect(JSON.parse(probe.stdout)).toEqual({ available: true, error: null })
    const resolved = await sh(process.execPath, ['-e', "console.log(require('node-gyp-build').resolve('node_modules/node-ibverbs'))"], consumer, env)
    expect(resolved.stdout.trim()).toBe(join(consumer, 'node_modules', 'node-ibverbs', 'prebuilds', `linux-${process.arch}`, 'node-ibverbs.glibc.node'))
  }, 60_000)

  it('can require() the package (Node >= 20.19, as engines says) as well as import it', async () => {
    const out = await sh(process.execPath, ['-e', "const m = require('node-ibverbs'); console.log(typeof m.openDevice, typeof m.isAvailable)"], consumer)
    expect(out.status, out.stderr).toBe(0)
    expect(out.stdout.trim()).toBe('function function')
  }, 60_000)
})
