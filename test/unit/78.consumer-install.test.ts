// The package as a consumer gets it: npm pack, then install the tarball into a
// fresh project with install scripts disabled and no compiler on PATH (as pnpm,
// `npm install --ignore-scripts` or a slim container would), type-check a
// strict TypeScript consumer against it, and load the prebuilt binary. The
// installed project is left in build/consumer for test/rdma/97, which runs the
// consumer with a real device (the RDMA phase of `npm test` comes after this one).
import { beforeAll, describe, expect, it } from 'vitest'
import { spawn, spawnSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const consumer = join(root, 'build', 'consumer')
const packDir = join(root, 'build', 'pack')
// A PATH with node and npm and nothing else: no cc, g++, make, python3.
const toolless = join(root, 'build', 'consumer-bin')
const prebuild = join(root, 'prebuilds', `linux-${process.arch}`, 'node-ibverbs.glibc.node')

interface PackResult { filename: string; size: number; unpackedSize: number; entryCount: number; files: Array<{ path: string }> }
let pack: PackResult
interface Ran { status: number | null; stdout: string; stderr: string }
let install: Ran

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

  const packed = await sh(process.execPath, [npmCli, 'pack', '--ignore-scripts', '--json', '--pack-destination', packDir], root)
  if (packed.status !== 0) throw new Error(`npm pack failed: ${packed.stderr}`)
  pack = JSON.parse(packed.stdout)[0]

  mkdirSync(consumer, { recursive: true })
  writeFileSync(join(consumer, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }, null, 2))
  copyFileSync(join(root, 'test', 'consumer', 'consumer.ts'), join(consumer, 'consumer.ts'))
  copyFileSync(join(root, 'test', 'consumer', 'tsconfig.json'), join(consumer, 'tsconfig.json'))
  const typesNode = JSON.parse(readFileSync(join(root, 'node_modules', '@types', 'node', 'package.json'), 'utf8')).version
  install = await sh(join(toolless, 'npm'), ['install', '--ignore-scripts', '--no-audit', '--no-fund', '--prefer-offline',
    join(packDir, pack.filename), `@types/node@${typesNode}`], consumer, { ...process.env, PATH: toolless })
}, 300_000)

describe('the packed tarball', () => {
  it('holds the runtime, the prebuild, the sources for a rebuild, docs and LICENSE; no maps or dev scripts', () => {
    const files = pack.files.map((f) => f.path)
    for (const file of ['package.json', 'LICENSE', 'README.md', 'docs/api.md', 'dist/index.js', 'dist/index.d.ts',
      'dist/cli/main.js', 'binding.gyp', 'native/addon.cc', 'scripts/install.mjs', 'scripts/softroce.sh',
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
    const env = { ...process.env, PATH: toolless, LD_BIND_NOW: '1' }
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
