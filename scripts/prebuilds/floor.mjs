#!/usr/bin/env node
// The symbol-version floor of the prebuilt binaries: the highest GLIBC_,
// GLIBCXX_, CXXABI_, GCC_, IBVERBS_ and RDMACM_ version each .node file needs
// (objdump -T) must not pass what glibc 2.28 with GCC 8's libstdc++ and
// rdma-core 28 provide (RHEL/Rocky 8, Debian 10/11, Ubuntu 20.04).
//
//   node scripts/prebuilds/floor.mjs [FILE.node ...]
// Without files: every prebuilds/*/*.node and build/Release/node_ibverbs.node.
// Prints one line per file and prefix; exits 1 if any file is over the floor.
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The most each library may require. */
export const FLOOR = {
  GLIBC: '2.28', // glibc 2.28: RHEL 8, Debian 10
  GLIBCXX: '3.4.25', // libstdc++ of GCC 8 (RHEL 8); the prebuilds link it statically and need none
  CXXABI: '1.3.11', // GCC 8
  GCC: '8.0.0', // libgcc_s; linked statically too
  IBVERBS: '1.8', // rdma-core 28 (libibverbs.so.1.8.28)
  RDMACM: '1.0', // what the addon uses; rdma-core 28 provides more
}

/** Compares dotted version strings numerically. */
export function compareVersions(a, b) {
  const x = a.split('.').map(Number)
  const y = b.split('.').map(Number)
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0)
    if (d !== 0) return d
  }
  return 0
}

/**
 * The version references that a library may lack (readelf -V: "Flags: WEAK";
 * the linker marks a reference weak when all its symbols are weak), e.g.
 * 'IBVERBS_1.11' for the weak _ibv_query_gid_ex: the loader then leaves
 * those symbols null instead of refusing the binary.
 */
export function weakVersions(readelfText) {
  const weak = new Set()
  for (const m of readelfText.matchAll(/Name:\s+(\S+)\s+Flags:\s+WEAK/g)) weak.add(m[1])
  return weak
}

/**
 * The highest version per prefix among the undefined (imported) symbols of
 * `objdump -T` output, with one symbol that needs it: { GLIBC: { version, symbol } }.
 * Versions in `optional` (weakVersions) are not needed and left out.
 */
export function highestVersions(objdumpText, optional = new Set()) {
  const highest = {}
  for (const line of objdumpText.split('\n')) {
    // e.g. "0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.34) pthread_create"
    //   or "0000000000000000      DF *UND*  0000000000000000  GLIBC_2.2.5 free"
    const m = line.match(/\*UND\*\s+\S+\s+\(?([A-Z]+)_([0-9][0-9.]*)\)?\s+(\S+)/)
    if (!m) continue
    const [, prefix, version, symbol] = m
    if (!(prefix in FLOOR) || optional.has(`${prefix}_${version}`)) continue
    if (!highest[prefix] || compareVersions(version, highest[prefix].version) > 0) highest[prefix] = { version, symbol }
  }
  return highest
}

/** Each prefix over the floor: [{ prefix, version, symbol, floor }]. */
export function overFloor(highest, floor = FLOOR) {
  return Object.entries(highest)
    .filter(([prefix, { version }]) => compareVersions(version, floor[prefix]) > 0)
    .map(([prefix, { version, symbol }]) => ({ prefix, version, symbol, floor: floor[prefix] }))
}

function readelfVersions(file) {
  const out = spawnSync('readelf', ['-V', file], { encoding: 'utf8' })
  if (out.status !== 0) throw new Error(`readelf -V ${file} failed (install binutils)`)
  return out.stdout
}

function objdump(file) {
  // The host's objdump reads the dynamic symbols of any ELF file; a cross
  // binutils is tried first for other architectures.
  for (const tool of ['objdump', 'aarch64-linux-gnu-objdump']) {
    const out = spawnSync(tool, ['-T', file], { encoding: 'utf8' })
    if (out.status === 0) return out.stdout
  }
  throw new Error(`objdump -T ${file} failed (install binutils)`)
}

function defaultFiles(root) {
  const files = []
  const prebuilds = join(root, 'prebuilds')
  if (existsSync(prebuilds)) {
    for (const dir of readdirSync(prebuilds)) {
      for (const file of readdirSync(join(prebuilds, dir))) if (file.endsWith('.node')) files.push(join(prebuilds, dir, file))
    }
  }
  const release = join(root, 'build', 'Release', 'node_ibverbs.node')
  if (existsSync(release)) files.push(release)
  return files
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
  const files = process.argv.length > 2 ? process.argv.slice(2) : defaultFiles(root)
  if (files.length === 0) {
    console.error('floor: no .node file to check (build first: npm run build or npm run release:prebuilds)')
    process.exit(1)
  }
  let failed = false
  for (const file of files) {
    const optional = weakVersions(readelfVersions(file))
    const highest = highestVersions(objdump(file), optional)
    const over = overFloor(highest)
    const summary = Object.keys(FLOOR)
      .map((prefix) => `${prefix}_${highest[prefix]?.version ?? '-'}`)
      .join(' ')
    const weak = optional.size ? ` (optional, used when present: ${[...optional].join(' ')})` : ''
    console.log(`${over.length ? 'FAIL' : 'ok  '} ${relative(process.cwd(), file)}: ${summary}${weak}`)
    for (const o of over) console.log(`       needs ${o.prefix}_${o.version} (${o.symbol}); the floor is ${o.prefix}_${o.floor}`)
    failed ||= over.length > 0
  }
  process.exit(failed ? 1 : 0)
}
