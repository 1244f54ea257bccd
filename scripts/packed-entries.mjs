#!/usr/bin/env node
// The files package.json sends a consumer to (main, types, every exports
// target, every bin) must be in the tarball: a pack without dist/ once
// installed fine and failed at the first import (ERR_MODULE_NOT_FOUND).
//   node scripts/packed-entries.mjs   runs `npm pack --dry-run --json` (which
//                                     runs prepack, as a publish does) and
//                                     exits 1 naming what is missing.
// scripts/prebuilds/check-release.mjs (prepublishOnly) and
// test/unit/78.consumer-install.test.ts use the functions.
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** Every path package.json names for a consumer, relative to the package root, sorted. */
export function entryFiles(pkg) {
  const out = new Set()
  const add = (value) => { if (typeof value === 'string') out.add(value.replace(/^\.\//, '')) }
  const walk = (value) => {
    if (typeof value === 'string') add(value)
    else if (Array.isArray(value)) value.forEach(walk)
    else if (value && typeof value === 'object') Object.values(value).forEach(walk) // conditions; null excludes a subpath
  }
  add(pkg.main)
  add(pkg.types)
  add(pkg.typings)
  walk(pkg.exports)
  if (typeof pkg.bin === 'string') add(pkg.bin)
  else if (pkg.bin && typeof pkg.bin === 'object') Object.values(pkg.bin).forEach(add)
  return [...out].sort()
}

/** The entry files of `pkg` that none of `packed` (tarball paths) provides. */
export function missingEntries(pkg, packed) {
  const have = new Set(packed)
  return entryFiles(pkg).filter((file) => {
    if (file.includes('*')) { // an exports pattern: some packed file must match it
      const pattern = new RegExp(`^${file.split('*').map((part) => part.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.+')}$`)
      return !packed.some((path) => pattern.test(path))
    }
    return !have.has(file)
  })
}

/** npm pack --dry-run --json in `root`: the paths the tarball would hold. npm's script banners may precede the JSON. */
export function dryRunPack(root) {
  const npm = process.env.npm_execpath
  const result = npm
    ? spawnSync(process.execPath, [npm, 'pack', '--dry-run', '--json'], { cwd: root, encoding: 'utf8' })
    : spawnSync('npm', ['pack', '--dry-run', '--json'], { cwd: root, encoding: 'utf8' })
  if (result.status !== 0) throw new Error(`npm pack --dry-run failed (exit ${result.status}):\n${result.stderr}`)
  return parsePackJson(result.stdout)[0].files.map((f) => f.path)
}

/** The JSON array `npm pack --json` prints, after whatever lifecycle scripts printed to stdout. */
export function parsePackJson(stdout) {
  const start = stdout.search(/^\[/m)
  if (start < 0) throw new Error(`no JSON in npm pack's output:\n${stdout}`)
  return JSON.parse(stdout.slice(start))
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = join(dirname(fileURLToPath(import.meta.url)), '..')
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
  const missing = missingEntries(pkg, dryRunPack(root))
  if (missing.length) {
    console.error(`the tarball lacks files package.json names (main/types/exports/bin):\n  ${missing.join('\n  ')}`)
    process.exit(1)
  }
  console.log(`packed entries: ${entryFiles(pkg).join(', ')}`)
}
