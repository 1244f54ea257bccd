#!/usr/bin/env node
// prepublishOnly: a published package must carry every prebuilt binary
// (`npm run release:prebuilds` makes them), each must pass the floor, and the
// tarball must hold every file package.json names (main, types, exports, bin:
// scripts/packed-entries.mjs, over `npm pack --dry-run`, which runs prepack).
import { spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { dryRunPack, missingEntries } from '../packed-entries.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
export const TARGETS = ['linux-x64', 'linux-arm64']
const files = TARGETS.map((target) => join(root, 'prebuilds', target, 'node-ibverbs.glibc.node'))
const missing = files.filter((file) => !existsSync(file))
if (missing.length) {
  console.error(`prepublishOnly: missing prebuilds (run npm run release:prebuilds):\n  ${missing.join('\n  ')}`)
  process.exit(1)
}
const floor = spawnSync(process.execPath, [join(root, 'scripts', 'prebuilds', 'floor.mjs'), ...files], { stdio: 'inherit' })
if (floor.status !== 0) process.exit(floor.status ?? 1)
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
const absent = missingEntries(pkg, dryRunPack(root))
if (absent.length) {
  console.error(`prepublishOnly: the tarball lacks files package.json names (main/types/exports/bin):\n  ${absent.join('\n  ')}`)
  process.exit(1)
}
