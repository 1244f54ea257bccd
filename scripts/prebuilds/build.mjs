#!/usr/bin/env node
// `npm run release:prebuilds`: builds every prebuilt binary the package ships
// (prebuildify --napi --strip --tag-libc) and checks their symbol floor.
//   prebuilds/linux-arm64/node-ibverbs.glibc.node  cross-compiled (Debian: g++-aarch64-linux-gnu,
//                                                   libibverbs-dev:arm64, librdmacm-dev:arm64)
//   prebuilds/linux-x64/node-ibverbs.glibc.node    built natively
// The prebuilds are not committed: a release runs this before `npm publish`
// (prepublishOnly checks both are there), and CI's consumer test makes the
// x64 one itself (test/unit/78.consumer-install.test.ts).
// Options: --only x64|arm64.
import { spawnSync } from 'node:child_process'
import { copyFileSync, existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const only = process.argv.includes('--only') ? process.argv[process.argv.indexOf('--only') + 1] : undefined
const prebuildify = join(root, 'node_modules', '.bin', 'prebuildify')
const common = ['--napi', '--strip', '--tag-libc']

function run(command, args, env = {}) {
  console.log(`\n$ ${Object.entries(env).map(([k, v]) => `${k}=${v} `).join('')}${command} ${args.join(' ')}`)
  const result = spawnSync(command, args, { cwd: root, stdio: 'inherit', env: { ...process.env, ...env } })
  if (result.status !== 0) {
    console.error(`release:prebuilds: ${command} failed (exit ${result.status})`)
    process.exit(1)
  }
}

const ARM64_NEEDS = 'dpkg --add-architecture arm64 && apt-get update && apt-get install g++-aarch64-linux-gnu libibverbs-dev:arm64 librdmacm-dev:arm64'

// arm64 first: each prebuildify run rebuilds build/Release, and the host's
// own (x64) build must be the one left there for the tests.
// (This assumes an x64 host, as CI's and the developers' machines are.)
if (only !== 'x64') {
  if (!existsSync('/usr/bin/aarch64-linux-gnu-g++') || !existsSync('/usr/lib/aarch64-linux-gnu/pkgconfig/libibverbs.pc')) {
    console.error(`release:prebuilds: the arm64 cross toolchain is missing; on Debian (root):\n  ${ARM64_NEEDS}`)
    process.exit(1)
  }
  run(prebuildify, [...common, '--arch', 'arm64', '--strip-bin', 'aarch64-linux-gnu-strip'], {
    CC: 'aarch64-linux-gnu-gcc',
    CXX: 'aarch64-linux-gnu-g++',
    LINK: 'aarch64-linux-gnu-g++',
    AR: 'aarch64-linux-gnu-ar',
    // binding.gyp asks pkg-config for the flags: the arm64 .pc files.
    PKG_CONFIG_LIBDIR: '/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig',
  })
}
if (only !== 'arm64') {
  run(prebuildify, [...common])
  // prebuildify moves the binary out of build/Release; the tests (and
  // node-gyp-build in this checkout) expect the host's build there.
  copyFileSync(join(root, 'prebuilds', 'linux-x64', 'node-ibverbs.glibc.node'), join(root, 'build', 'Release', 'node_ibverbs.node'))
}

run(process.execPath, [join(root, 'scripts', 'prebuilds', 'floor.mjs')])

// The arm64 binary under qemu-user with Debian's arm64 Node, where that works.
if (only !== 'x64' && existsSync('/usr/bin/qemu-aarch64-static')) {
  run('bash', [join(root, 'scripts', 'prebuilds', 'arm64-smoke.sh')])
} else if (only !== 'x64') {
  console.log('\nrelease:prebuilds: no qemu-user-static: the arm64 smoke load (scripts/prebuilds/arm64-smoke.sh) was not run')
}
