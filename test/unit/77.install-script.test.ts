// npm's install step (scripts/install.mjs) in a copy of the package laid out
// as a consumer gets it: with a prebuild nothing compiles; without one and
// without a compiler, the error names the packages per distribution.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
// @ts-expect-error: a plain .mjs script without types
import { BUILD_PACKAGES as INSTALL_PACKAGES } from '../../scripts/install.mjs'
import { BUILD_PACKAGES } from '../../dist/native/addon.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
let work: string
let toolless: string

/** A copy of the package files install.mjs sees (no build/, no prebuilds/). */
function packageCopy(name: string): string {
  const dir = join(work, name)
  mkdirSync(join(dir, 'scripts'), { recursive: true })
  copyFileSync(join(root, 'package.json'), join(dir, 'package.json'))
  copyFileSync(join(root, 'binding.gyp'), join(dir, 'binding.gyp'))
  copyFileSync(join(root, 'scripts', 'install.mjs'), join(dir, 'scripts', 'install.mjs'))
  cpSync(join(root, 'native'), join(dir, 'native'), { recursive: true })
  symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'))
  return dir
}

function install(dir: string) {
  const env: NodeJS.ProcessEnv = { ...process.env, PATH: toolless }
  delete env.npm_config_node_gyp
  delete env.NODE_IBVERBS_BUILD_FROM_SOURCE
  delete env.npm_config_build_from_source
  return spawnSync(process.execPath, [join(dir, 'scripts', 'install.mjs')], { cwd: dir, env, encoding: 'utf8', timeout: 60_000 })
}

beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'ibverbs-install-'))
  toolless = join(work, 'bin') // node only: no c++, make, pkg-config
  mkdirSync(toolless)
  symlinkSync(process.execPath, join(toolless, 'node'))
})
afterAll(() => rmSync(work, { recursive: true, force: true }))

describe('scripts/install.mjs', () => {
  it('gives the same package list as the load error', () => {
    expect(INSTALL_PACKAGES).toBe(BUILD_PACKAGES)
  })

  it('compiles nothing when a prebuild for this platform loads', () => {
    const dir = packageCopy('with-prebuild')
    mkdirSync(join(dir, 'prebuilds', `linux-${process.arch}`), { recursive: true })
    copyFileSync(join(root, 'build', 'Release', 'node_ibverbs.node'), join(dir, 'prebuilds', `linux-${process.arch}`, 'node-ibverbs.glibc.node'))
    const out = install(dir)
    expect(out.status, out.stderr).toBe(0)
    expect(out.stderr).toBe('')
    expect(existsSync(join(dir, 'build'))).toBe(false)
  })

  it('without a prebuild or a compiler, fails naming the packages for Debian/Ubuntu, RHEL/Fedora and Alpine', () => {
    const dir = packageCopy('without-prebuild')
    const out = install(dir)
    expect(out.status).toBe(1)
    expect(out.stderr).toContain('no C++ compiler')
    expect(out.stderr).toContain(`No prebuilt binary matches this platform (linux-${process.arch})`)
    for (const line of BUILD_PACKAGES.split('\n')) expect(out.stderr).toContain(line.trim())
    expect(out.stderr).toContain('npm rebuild node-ibverbs')
    expect(existsSync(join(dir, 'build'))).toBe(false)
  })
})
