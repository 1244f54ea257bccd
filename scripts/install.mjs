#!/usr/bin/env node
// npm's install step for node-ibverbs. With a prebuilt binary for this
// platform (prebuilds/), nothing compiles. Without one, the addon is built
// from source, and a build that cannot work says which packages to install.
// With scripts disabled (--ignore-scripts, pnpm) this does not run at all and
// the package still works when a prebuild matches: lib/native/addon.ts loads it on
// first use. NODE_IBVERBS_BUILD_FROM_SOURCE=1 (or npm's --build-from-source)
// forces the source build.
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { dirname, join, sep } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const root = join(dirname(fileURLToPath(import.meta.url)), '..')

// The same list as lib/native/addon.ts's BUILD_PACKAGES (test/unit/77 checks they agree).
export const BUILD_PACKAGES =
  '  Debian/Ubuntu: apt-get install libibverbs-dev librdmacm-dev pkg-config python3 make g++\n' +
  '  RHEL/Fedora:   dnf install rdma-core-devel pkgconf-pkg-config python3 make gcc-c++\n' +
  '  Alpine:        apk add rdma-core-dev pkgconf python3 make g++ linux-headers'
const RUNTIME_PACKAGES =
  '  Debian/Ubuntu: apt-get install libibverbs1 librdmacm1 ibverbs-providers\n' +
  '  RHEL/Fedora:   dnf install rdma-core libibverbs librdmacm\n' +
  '  Alpine:        apk add rdma-core'

function say(text) {
  process.stderr.write(`node-ibverbs: ${text}\n`)
}

function fromSourceForced() {
  return process.env.NODE_IBVERBS_BUILD_FROM_SOURCE === '1' || process.env.npm_config_build_from_source === 'true'
}

/** 'loaded', 'no-runtime' (a prebuild matches but rdma-core's libraries are missing), or 'none'. */
function prebuiltState() {
  let file
  try {
    file = require('node-gyp-build').resolve(root)
  } catch {
    return 'none'
  }
  try {
    require(file)
    return 'loaded'
  } catch (error) {
    const message = String(error?.message ?? error)
    if (file.includes(`${sep}prebuilds${sep}`) && /lib(ibverbs|rdmacm)\.so/.test(message)) {
      say(`the prebuilt binary needs rdma-core's runtime libraries (${message.split('\n')[0]}).\n` +
        `Install them before using RDMA:\n${RUNTIME_PACKAGES}`)
      return 'no-runtime'
    }
    return 'none'
  }
}

function has(command, args) {
  return spawnSync(command, args, { stdio: 'ignore' }).status === 0
}

function failBuild(why) {
  say(`${why}\nNo prebuilt binary matches this platform (${process.platform}-${process.arch}), so the addon ` +
    `is built from source. That needs a C++ compiler, make, python3, pkg-config and rdma-core's headers:\n` +
    `${BUILD_PACKAGES}\nthen run: npm rebuild node-ibverbs`)
  process.exit(1)
}

function buildFromSource() {
  const cxx = process.env.CXX || 'c++'
  if (!has(cxx, ['--version'])) failBuild(`no C++ compiler (${cxx}) on PATH.`)
  if (!has('make', ['--version'])) failBuild('no make on PATH.')
  if (!has('pkg-config', ['--exists', 'libibverbs', 'librdmacm'])) {
    failBuild('pkg-config does not find libibverbs and librdmacm (rdma-core\'s development files).')
  }
  // npm hands install scripts its own node-gyp; a checkout has it as a devDependency.
  let nodeGyp = process.env.npm_config_node_gyp
  if (!nodeGyp) {
    try { nodeGyp = require.resolve('node-gyp/bin/node-gyp.js') } catch { /* below */ }
  }
  const result = nodeGyp
    ? spawnSync(process.execPath, [nodeGyp, 'rebuild'], { cwd: root, stdio: 'inherit' })
    : spawnSync('node-gyp', ['rebuild'], { cwd: root, stdio: 'inherit' })
  if (result.status !== 0) failBuild(`the source build failed (node-gyp rebuild, exit ${result.status ?? result.error?.message}).`)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (fromSourceForced() || prebuiltState() === 'none') buildFromSource()
}
