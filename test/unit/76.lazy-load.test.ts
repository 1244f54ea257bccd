// Importing the package never throws: the addon loads on first use, and
// isAvailable()/loadError() tell a service whether it can use RDMA (or must
// fall back to TCP). The pure helpers work without the addon. Each case runs
// in a child process, because a process loads (or fails to load) the addon once.
import { describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const dist = join(root, 'dist', 'index.js')

/** Runs an ES module script in a child Node; returns its stdout parsed as JSON. */
function child(script: string, env: Record<string, string> = {}): Record<string, unknown> {
  const out = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    cwd: root, encoding: 'utf8', env: { ...process.env, ...env }, timeout: 60_000,
  })
  expect(out.status, `child failed: ${out.stderr}`).toBe(0)
  return JSON.parse(out.stdout.trim().split('\n').pop()!)
}

// A .node file loaded through require() shows up in require.cache.
const addonLoaded = `Object.keys(createRequire(import.meta.url).cache).some((f) => f.endsWith('.node'))`

describe('without a loadable addon (NODE_IBVERBS_ADDON names a missing file)', () => {
  const missing = { NODE_IBVERBS_ADDON: join(root, 'build', 'no-such-dir', 'node_ibverbs.node') }

  it('imports, reports the load error, and keeps the pure helpers working', () => {
    const result = child(`
      const api = await import(${JSON.stringify(dist)})
      const out = { imported: true }
      out.available = api.isAvailable()
      const error = api.loadError()
      out.isRdmaError = error instanceof api.RdmaError
      out.code = error?.code
      out.message = error?.message
      out.hasCause = error?.cause instanceof Error
      try { api.listDevices() } catch (e) { out.listDevicesCode = e.code; out.sameError = e === error }
      try { api.openDevice() } catch (e) { out.openDeviceCode = e.code }
      const descriptors = [{ addr: '0x7f0012345000', rkey: 4660, length: 65536 }]
      out.decoded = api.decodeDescriptors(api.encodeDescriptors(descriptors))
      const remote = api.remoteRegion({ version: 1, ...descriptors[0] })
      const slice = remote.slice(4096, 512)
      out.slice = { addr: String(slice.addr), rkey: slice.rkey, length: slice.length }
      console.log(JSON.stringify(out))
    `, missing)
    expect(result.imported).toBe(true)
    expect(result.available).toBe(false)
    expect(result.isRdmaError).toBe(true)
    expect(result.code).toBe('ERR_ADDON_LOAD')
    expect(result.hasCause).toBe(true)
    expect(result.message).toMatch(/^node-ibverbs: could not load the native addon \(/)
    for (const line of ['apt-get install libibverbs-dev librdmacm-dev', 'dnf install rdma-core-devel', 'apk add rdma-core-dev',
      'apt-get install libibverbs1 librdmacm1 ibverbs-providers', 'npm rebuild node-ibverbs']) {
      expect(result.message).toContain(line)
    }
    // Every use throws the same remembered error.
    expect(result.listDevicesCode).toBe('ERR_ADDON_LOAD')
    expect(result.sameError).toBe(true)
    expect(result.openDeviceCode).toBe('ERR_ADDON_LOAD')
    expect(result.decoded).toEqual([{ version: 1, addr: '0x7f0012345000', rkey: 4660, length: 65536 }])
    expect(result.slice).toEqual({ addr: String(0x7f0012345000n + 4096n), rkey: 4660, length: 512 })
  })
})

describe('with the addon built', () => {
  it('does not load it at import, only on first use', () => {
    const result = child(`
      import { createRequire } from 'node:module'
      const api = await import(${JSON.stringify(dist)})
      const atImport = ${addonLoaded}
      const available = api.isAvailable()
      console.log(JSON.stringify({ atImport, available, error: api.loadError(), afterUse: ${addonLoaded} }))
    `)
    expect(result).toEqual({ atImport: false, available: true, error: null, afterUse: true })
  })
})

describe('the CLI', () => {
  const cli = join(root, 'dist', 'cli', 'main.js')
  it('exits 2 with the usage on stderr when given no command', () => {
    const out = spawnSync(process.execPath, [cli], { encoding: 'utf8', timeout: 60_000 })
    expect(out.status).toBe(2)
    expect(out.stderr).toContain('node-ibverbs: no command given')
    expect(out.stderr).toContain('usage: node-ibverbs COMMAND')
    expect(out.stdout).toBe('')
  })

  it('prints the usage and exits 0 for help', () => {
    const out = spawnSync(process.execPath, [cli, 'help'], { encoding: 'utf8', timeout: 60_000 })
    expect(out.status).toBe(0)
    expect(out.stdout).toContain('usage: node-ibverbs COMMAND')
  })
})
