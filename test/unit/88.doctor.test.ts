// `node-ibverbs doctor` on a machine without RDMA devices (the host: its
// kernel has none): the built CLI says so in its JSON, names how to get
// Soft-RoCE (rxe here, or the QEMU guest), and exits non-zero. The checks
// with a device are in test/rdma/98.doctor.test.ts.
import { describe, expect, it } from 'vitest'
import { spawn } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { DoctorReport } from '../../dist/index.js'
import { parseSize } from '../../dist/cli/doctor.js'
import { kernelDevices } from './kernel-devices.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const cli = join(root, 'dist', 'cli', 'main.js')
const hasDevices = kernelDevices().length > 0
const noDeviceHere = hasDevices ? ' [skipped: this kernel has RDMA devices; test/rdma/98 covers them]' : ''

function doctor(...args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return doctorWith({}, ...args)
}

function doctorWith(extra: NodeJS.ProcessEnv, ...args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const env = { ...process.env }
    delete env.NODE_IBVERBS_ADDON
    Object.assign(env, extra)
    const child = spawn(process.execPath, [cli, 'doctor', ...args], { env, stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000 })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (c) => { stdout += c })
    child.stderr.on('data', (c) => { stderr += c })
    child.on('close', (status) => resolve({ status, stdout, stderr }))
  })
}

describe('doctor without an RDMA device', () => {
  it.skipIf(hasDevices)(`--json: devices fail with a fix naming rxe and softroce, exit code 1${noDeviceHere}`, async () => {
    const out = await doctor('--json')
    expect(out.status, out.stderr).toBe(1)
    const report = JSON.parse(out.stdout) as DoctorReport
    expect(report).toMatchObject({ version: 1, ok: false, node: process.version })
    const devices = report.checks.find((c) => c.id === 'devices')
    expect(devices).toMatchObject({ status: 'fail', message: 'no RDMA device on this machine', facts: { names: [], kernelDevices: [] } })
    expect(devices!.fix).toMatch(/rxe/)
    expect(devices!.fix).toMatch(/softroce run/)
    // The host has rdma-core and a built addon: those checks pass and say what they found.
    const core = report.checks.find((c) => c.id === 'rdma-core')
    expect(core?.status).toBe('ok')
    if (core?.id === 'rdma-core') expect(core.facts.libibverbs).toMatch(/^libibverbs\.so\.1/)
    const addon = report.checks.find((c) => c.id === 'addon')
    expect(addon).toMatchObject({ status: 'ok', facts: { loaded: true } })
    // Why there is no device is its own check: rxe here or not, and what to run instead.
    const rxe = report.checks.find((c) => c.id === 'rxe')
    expect(rxe?.status === 'ok' || (rxe?.status === 'warn' && /softroce run/.test(rxe.fix ?? ''))).toBe(true)
    // Nothing that needs a device ran, and the counts add up.
    expect(report.checks.filter((c) => c.id === 'port' || c.id === 'rdma-cm' || c.id === 'gid')).toEqual([])
    const counts = { ok: 0, warn: 0, fail: 0, skip: 0 }
    for (const check of report.checks) {
      counts[check.status]++
      expect(typeof check.message).toBe('string')
      if (check.status === 'fail') expect(check.fix, check.id).toBeTruthy()
    }
    expect(report.counts).toEqual(counts)
  }, 120_000)

  it.skipIf(hasDevices)(`the text report shows the failure and its fix, exit code 1${noDeviceHere}`, async () => {
    const out = await doctor()
    expect(out.status, out.stderr).toBe(1)
    expect(out.stdout).toMatch(/^fail +devices +no RDMA device on this machine$/m)
    expect(out.stdout).toMatch(/^ +fix: .*rxe/m)
    expect(out.stdout).toMatch(/\d+ ok, \d+ warn, [1-9]\d* fail, \d+ skipped \(exit code 1\)$/m)
  }, 120_000)

  it.skipIf(hasDevices)(`--register without a device: the limit is compared, nothing is tried${noDeviceHere}`, async () => {
    const out = await doctor('--json', '--register', '1M')
    const memlock = (JSON.parse(out.stdout) as DoctorReport).checks.find((c) => c.id === 'memlock')
    expect(memlock).toMatchObject({ facts: { requestedBytes: 1 << 20, triedOn: null } })
    expect(memlock!.message).toContain('not tried: no device with an ACTIVE port')
  }, 120_000)

  it('an addon that does not load: the addon check fails with loadError()\'s fix, rdma-core is read from ldconfig, devices are skipped', async () => {
    const out = await doctorWith({ NODE_IBVERBS_ADDON: join(root, 'build', 'no-such-addon.node') }, '--json')
    expect(out.status, out.stderr).toBe(1)
    const report = JSON.parse(out.stdout) as DoctorReport
    const addon = report.checks.find((c) => c.id === 'addon')
    expect(addon).toMatchObject({ status: 'fail', facts: { loaded: false, binary: null, errorCode: 'ERR_ADDON_LOAD' } })
    expect(addon!.message).toMatch(/^node-ibverbs: could not load the native addon/)
    expect(addon!.fix).toContain('apt-get install libibverbs1 librdmacm1 ibverbs-providers')
    expect(report.checks.find((c) => c.id === 'rdma-core')).toMatchObject({ status: 'ok', facts: { source: 'ldconfig' } })
    expect(report.checks.find((c) => c.id === 'devices')).toMatchObject({ status: 'skip' })
  }, 120_000)

  it('refuses bad options with exit code 2 and the usage', async () => {
    for (const args of [['--register', 'lots'], ['--register'], ['--timeout', '-1'], ['--frobnicate']]) {
      const out = await doctor(...args)
      expect(out.status, args.join(' ')).toBe(2)
      expect(out.stderr).toContain('usage: node-ibverbs doctor')
      expect(out.stdout).toBe('')
    }
  }, 120_000)

  it('reads sizes in binary units', () => {
    expect(parseSize('4096')).toBe(4096)
    expect(parseSize('64k')).toBe(65536)
    expect(parseSize('1M')).toBe(1 << 20)
    expect(parseSize('2GiB')).toBe(2 * 2 ** 30)
    expect(parseSize('1.5M')).toBe(1.5 * 2 ** 20)
    for (const bad of ['', '0', '-1', '1X', 'M', '0.1']) expect(parseSize(bad), bad).toBeUndefined()
  })
})
