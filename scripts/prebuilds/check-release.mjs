#!/usr/bin/env node
// prepublishOnly: a published package must carry every prebuilt binary
// (`npm run release:prebuilds` makes them) and each must pass the floor.
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
export const TARGETS = ['linux-x64', 'linux-arm64']
const files = TARGETS.map((target) => join(root, 'prebuilds', target, 'node-ibverbs.glibc.node'))
const missing = files.filter((file) => !existsSync(file))
if (missing.length) {
  console.error(`prepublishOnly: missing prebuilds (run npm run release:prebuilds):\n  ${missing.join('\n  ')}`)
  process.exit(1)
}
const floor = spawnSync(process.execPath, [join(root, 'scripts', 'prebuilds', 'floor.mjs'), ...files], { stdio: 'inherit' })
process.exit(floor.status ?? 1)
