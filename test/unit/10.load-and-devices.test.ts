// Layer 1: the addon loads, and device discovery fails helpfully on a machine
// without RDMA devices. Uses the compiled package (dist/) like a consumer does.
import { describe, expect, it } from 'vitest'
import { thrown } from './thrown.js'
import { spawnSync } from 'node:child_process'
import { cpSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import * as api from '../../dist/index.js'
import { native } from '../../dist/native/addon.js'
import { NO_DEVICES_HELP } from '../../dist/verbs/device.js'
import { kernelDevices } from './kernel-devices.js'
import { needs } from '../rdma/needs.js'

const { listDevices, openDevice, RdmaError } = api
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const noDevices = listDevices().length === 0
// The help for a machine without devices shows only where there are none (as on the CI host): elsewhere
// these tests say why they are skipped, and under CI / NODE_IBVERBS_REQUIRE_RDMA=1 they fail instead.
const withoutDevices = needs(noDevices ? undefined : `this machine has RDMA devices (${listDevices().map((d) => d.name).join(', ')}); the message for none shows only where there are none`)

describe('the addon', () => {
  it('loads and exposes its classes and layout constants', () => {
    for (const name of ['Context', 'ProtectionDomain', 'NativeBuffer', 'MemoryRegion', 'CompletionQueue',
      'QueuePair', 'SharedReceiveQueue', 'AddressHandle', 'MemoryWindow', 'listDevices'] as const) {
      expect(typeof native[name], name).toBe('function')
    }
    // The TS encoder/decoder rely on these matching native/hot/work_request.h and native/core/resources.h.
    expect(native.completionWords).toBe(16)
    expect(native.sendHeaderWords).toBe(16)
    expect(native.recvHeaderWords).toBe(4)
  })

  it('has its test-only entry points only when the process asks for them (NODE_IBVERBS_TEST_HOOKS=1)', () => {
    const addon = join(root, 'build', 'Release', 'node_ibverbs.node')
    const hooks = (value: string | undefined) => {
      const env = { ...process.env }
      if (value === undefined) delete env.NODE_IBVERBS_TEST_HOOKS
      else env.NODE_IBVERBS_TEST_HOOKS = value
      return spawnSync(process.execPath, ['-e', `console.log(Object.keys(require(${JSON.stringify(addon)})).filter((k) => k.startsWith('__testOnly')).length)`],
        { encoding: 'utf8', env }).stdout.trim()
    }
    expect(hooks(undefined)).toBe('0')
    expect(hooks('0')).toBe('0')
    expect(Number(hooks('1'))).toBeGreaterThan(0)
  })

  it('exports the documented public API', () => {
    expect(Object.keys(api).sort()).toEqual([
      'Access', 'AddressHandle', 'CompletionQueue', 'Connection', 'ConnectionRequest', 'Device', 'LIBRARY_ERROR_CODES', 'Listener',
      'LocalSlice', 'MemoryRegion', 'MemoryWindow', 'NativeMemory', 'Peer', 'PlainMemory', 'ProtectionDomain', 'QpState',
      'QueuePair', 'RdmaError', 'RemoteLockTable', 'RemoteRegion', 'RemoteSlice', 'Segment', 'SharedReceiveQueue',
      'TransferAgent', 'TransferError', 'TransferPlan', 'connect', 'decodeDescriptors', 'decodeWord', 'enableForkSupport',
      'encodeDescriptors', 'forkSupport', 'heldWord', 'isAvailable', 'listDevices', 'listen', 'loadError',
      'openDevice', 'remoteRegion', 'wcStatusNames',
    ])
  })

  it('reports a failed load with code ERR_ADDON_LOAD and install hints', () => {
    // A copy of dist/native/addon.js in a package without build/ or prebuilds/:
    // node-gyp-build finds no binary, and load() must explain what to do.
    const dir = mkdtempSync(join(tmpdir(), 'ibverbs-noaddon-'))
    try {
      mkdirSync(join(dir, 'dist', 'native'), { recursive: true })
      mkdirSync(join(dir, 'dist', 'core'))
      cpSync(join(root, 'dist', 'native', 'addon.js'), join(dir, 'dist', 'native', 'addon.js'))
      cpSync(join(root, 'dist', 'core', 'errors.js'), join(dir, 'dist', 'core', 'errors.js'))
      writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'x', type: 'module' }))
      symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'))
      // Importing never throws (the addon loads on first use): loadError() tells.
      const script = `import('./dist/native/addon.js').then((m) => { const e = m.loadError(); console.log(e ? JSON.stringify({ code: e.code, message: e.message, cause: !!e.cause }) : 'LOADED') })`
      const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: dir, encoding: 'utf8' })
      const out = child.stdout.trim()
      expect(out).not.toBe('LOADED')
      const result = JSON.parse(out)
      expect(result.code).toBe('ERR_ADDON_LOAD')
      expect(result.cause).toBe(true)
      expect(result.message).toMatch(/^node-ibverbs: could not load the native addon \(/)
      expect(result.message).toContain('apt-get install libibverbs1 librdmacm1 ibverbs-providers')
      expect(result.message).toContain('npm rebuild node-ibverbs')
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('listDevices()', () => {
  // Compared with sysfs, so the test means something with and without devices
  // (test/rdma/10 runs the same check in the guest, where rxe0 exists).
  it('lists exactly the devices the kernel has, as {name, guid, nodeType, transport}', () => {
    const devices = listDevices()
    expect(Array.isArray(devices)).toBe(true)
    expect(devices.map(({ name, guid, nodeType }) => ({ name, guid, nodeType })).sort((a, b) => a.name.localeCompare(b.name))).toEqual(kernelDevices())
    for (const d of devices) {
      expect(d.guid).toMatch(/^[0-9a-f]{4}(:[0-9a-f]{4}){3}$/)
      expect(['IB', 'other']).toContain(d.transport)
    }
  })
})

describe('openDevice()', () => {
  it('rejects a non-string name with ERR_INVALID_ARG_TYPE', () => {
    const error = thrown(() => openDevice(42 as unknown as string))
    expect(error).toBeInstanceOf(TypeError)
    expect(error.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(error.message).toBe('Expected a device name for name but received 42')
  })

  it('throws ENODEV naming what exists for an unknown device', () => {
    const error = thrown(() => openDevice('no-such-device-0'))
    expect(error).toBeInstanceOf(RdmaError)
    expect(error.name).toBe('RdmaError')
    expect(error.code).toBe('ENODEV')
    // Without any device the message says how to get one instead (tested below).
    expect(error.message).toMatch(noDevices ? /^No RDMA devices on this machine\./ : /^No RDMA device named 'no-such-device-0'; available: /)
    expect(error.devices).toEqual(listDevices().map((d) => d.name))
  })

  withoutDevices("openDevice('rxe0') says there are no devices", () => {
    const error = thrown(() => openDevice('rxe0'))
    expect(error).toBeInstanceOf(RdmaError)
    expect(error.code).toBe('ENODEV')
    // No devices at all: how to get one (native rxe first, then a QEMU guest), not "no such name".
    expect(error.message).toBe(NO_DEVICES_HELP)
    expect(error.devices).toEqual([])
  })

  withoutDevices('openDevice() without a name says there are no devices', () => {
    const error = thrown(() => openDevice())
    expect(error).toBeInstanceOf(RdmaError)
    expect(error.code).toBe('ENODEV')
    expect(error.message).toBe(NO_DEVICES_HELP)
    expect(error.message.indexOf('modprobe rdma_rxe')).toBeLessThan(error.message.indexOf('softroce run'))
    expect(error.message).toContain('npx node-ibverbs devices')
    expect(error.devices).toEqual([])
  })
})
