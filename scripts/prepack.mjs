#!/usr/bin/env node
// prepack (npm pack, npm publish): the tarball carries dist/, built here from
// lib/ afresh. dist/ is removed first so a file deleted or moved in lib/ does
// not ship as a stale copy. A fresh clone needs `npm ci` first (TypeScript is a
// devDependency); the prebuilds come from `npm run release:prebuilds`, and a
// pack without them is allowed (the consumer then builds from source) but said.
import { spawnSync } from 'node:child_process'
import { chmodSync, existsSync, rmSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc')
if (!existsSync(tsc)) {
  console.error('prepack: TypeScript is not installed (run npm ci first): the tarball would have no dist/')
  process.exit(1)
}
rmSync(join(root, 'dist'), { recursive: true, force: true })
const built = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.json')], { cwd: root, stdio: 'inherit' })
if (built.status !== 0) {
  console.error(`prepack: tsc failed (exit ${built.status ?? built.error?.message})`)
  process.exit(1)
}
chmodSync(join(root, 'dist', 'cli', 'main.js'), 0o755)
for (const target of ['linux-x64', 'linux-arm64']) {
  if (!existsSync(join(root, 'prebuilds', target, 'node-ibverbs.glibc.node'))) {
    console.error(`prepack: no prebuild for ${target} (npm run release:prebuilds): consumers there build from source`)
  }
}
