// The symbol-version floor (scripts/prebuilds/floor.mjs): the binaries must
// load on glibc 2.28 and rdma-core 28 (RHEL 8, Debian 10/11, Ubuntu 20.04).
// The x64 build that CI makes uses the same flags as the prebuilds
// (binding.gyp), so checking it here is the CI step; prebuilds present in
// prebuilds/ (npm run release:prebuilds) are checked too.
import { describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
// @ts-expect-error: a plain .mjs script without types
import { FLOOR, compareVersions, highestVersions, overFloor, weakVersions } from '../../scripts/prebuilds/floor.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const floorScript = join(root, 'scripts', 'prebuilds', 'floor.mjs')

// Lines as objdump -T prints them (binutils 2.40; older ones omit the parentheses for some).
const SAMPLE = `
0000000000000000      DF *UND*	0000000000000000 (GLIBC_2.2.5) free
0000000000000000      DF *UND*	0000000000000000 (GLIBC_2.32) strerrorname_np
0000000000000000      DO *UND*	0000000000000000 (GLIBC_2.32) __libc_single_threaded
0000000000000000      DF *UND*	0000000000000000  GLIBC_2.28  fcntl64
0000000000000000      DF *UND*	0000000000000000 (GLIBCXX_3.4.29) _ZSt28__throw_bad_array_new_lengthv
0000000000000000      DF *UND*	0000000000000000 (IBVERBS_1.1) ibv_open_device
0000000000000000      DF *UND*	0000000000000000 (IBVERBS_1.11) _ibv_query_gid_ex
0000000000000000      DF *UND*	0000000000000000 (IBVERBS_1.8) ibv_reg_mr_iova2
0000000000000000      DF *UND*	0000000000000000 (RDMACM_1.0) rdma_create_id
0000000000012340 g    DF .text	0000000000000042  Base        napi_register_module_v1
0000000000000000  w   D  *UND*	0000000000000000  Base        __gmon_start__
`

describe('the floor check', () => {
  it('compares versions numerically (1.11 is above 1.8)', () => {
    expect(compareVersions('1.11', '1.8')).toBeGreaterThan(0)
    expect(compareVersions('2.2.5', '2.28')).toBeLessThan(0)
    expect(compareVersions('3.4.25', '3.4.25')).toBe(0)
  })

  it('finds the highest version each library needs, and what passes the floor', () => {
    const highest = highestVersions(SAMPLE)
    expect(highest).toEqual({
      GLIBC: { version: '2.32', symbol: 'strerrorname_np' },
      GLIBCXX: { version: '3.4.29', symbol: '_ZSt28__throw_bad_array_new_lengthv' },
      IBVERBS: { version: '1.11', symbol: '_ibv_query_gid_ex' },
      RDMACM: { version: '1.0', symbol: 'rdma_create_id' },
    })
    expect(overFloor(highest).map((o: { prefix: string }) => o.prefix).sort()).toEqual(['GLIBC', 'GLIBCXX', 'IBVERBS'])
    expect(FLOOR).toMatchObject({ GLIBC: '2.28', IBVERBS: '1.8' })
  })

  it('leaves out version references the loader treats as optional (weak)', () => {
    const readelf = `Version needs section '.gnu.version_r' contains 2 entries:
  000000: Version: 1  File: libibverbs.so.1  Cnt: 3
  0x0010:   Name: IBVERBS_1.11  Flags: WEAK  Version: 6
  0x0020:   Name: IBVERBS_1.8  Flags: none  Version: 5
  0x0030:   Name: IBVERBS_1.1  Flags: none  Version: 4`
    const optional = weakVersions(readelf)
    expect([...optional]).toEqual(['IBVERBS_1.11'])
    expect(highestVersions(SAMPLE, optional).IBVERBS).toEqual({ version: '1.8', symbol: 'ibv_reg_mr_iova2' })
  })

  it('passes for the built addon and every prebuild present (objdump -T)', () => {
    const files = [join(root, 'build', 'Release', 'node_ibverbs.node')]
    const prebuilds = join(root, 'prebuilds')
    if (existsSync(prebuilds)) {
      for (const dir of readdirSync(prebuilds)) {
        for (const f of readdirSync(join(prebuilds, dir))) if (f.endsWith('.node')) files.push(join(prebuilds, dir, f))
      }
    }
    expect(existsSync(files[0]!), 'build/Release/node_ibverbs.node (npm run build)').toBe(true)
    const out = spawnSync(process.execPath, [floorScript, ...files], { encoding: 'utf8', timeout: 60_000 })
    expect(out.stdout + out.stderr).not.toContain('FAIL')
    expect(out.status, out.stdout + out.stderr).toBe(0)
    expect(out.stdout.split('\n').filter((l) => l.startsWith('ok')).length).toBe(files.length)
  })
})

describe('ibv_query_gid_ex without IBVERBS_1.11', () => {
  // The binary does not reference it (the floor check above proves that); it
  // is looked up at run time. This rdma-core (>= 31) has it, so it is found;
  // NODE_IBVERBS_GID_FALLBACK=1 selects the ibv_query_gid + sysfs path that
  // rdma-core 28 gets (test/rdma/96 checks both give the same table).
  const which = (env: Record<string, string>) => spawnSync(process.execPath, ['-e',
    `console.log(require(${JSON.stringify(join(root, 'build', 'Release', 'node_ibverbs.node'))}).__testOnlyGidQuery())`],
  { encoding: 'utf8', timeout: 60_000, env: { ...process.env, ...env } }).stdout.trim()

  it('is found at run time in a libibverbs that has it', () => {
    expect(which({})).toBe('ibv_query_gid_ex')
  })

  it('is left out with NODE_IBVERBS_GID_FALLBACK=1', () => {
    expect(which({ NODE_IBVERBS_GID_FALLBACK: '1' })).toBe('sysfs')
  })
})

describe('ibv_reg_dmabuf_mr without IBVERBS_1.12', () => {
  // pd.registerDmabuf's verb (rdma-core 34) is looked up at run time too: the
  // binary must not reference it at all (a weak reference would pass the
  // floor above but still name IBVERBS_1.12).
  const addonPath = join(root, 'build', 'Release', 'node_ibverbs.node')

  it('is not among the symbols the binary imports', () => {
    const out = spawnSync('objdump', ['-T', addonPath], { encoding: 'utf8', timeout: 60_000 })
    expect(out.status, out.stderr).toBe(0)
    expect(out.stdout).toContain('ibv_reg_mr') // the listing has the verbs it does import
    expect(out.stdout.split('\n').filter((l) => /\*UND\*.*ibv_reg_dmabuf_mr/.test(l))).toEqual([])
  })

  it('is found at run time in a libibverbs that has it', () => {
    const out = spawnSync(process.execPath, ['-e', `console.log(require(${JSON.stringify(addonPath)}).__testOnlyDmabufSymbol())`],
      { encoding: 'utf8', timeout: 60_000, env: { ...process.env, NODE_IBVERBS_TEST_HOOKS: '1' } })
    expect(out.stdout.trim(), out.stderr).toBe('ibv_reg_dmabuf_mr')
  })
})
