// dma-buf registration (pd.registerDmabuf over ibv_reg_dmabuf_mr) with a real
// dma-buf: a vgem buffer (the kernel's virtual GEM driver) exported through
// PRIME. Debian's 6.1 kernel has no udmabuf (CONFIG_UDMABUF is not set), so
// the memfd route is not there; vgem is (CONFIG_DRM_VGEM=m).
// Soft-RoCE cannot register dma-buf memory: these tests check that it says so
// with a code and the device's name, that nothing is left registered, and
// that bad arguments are refused before the verb is called.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { closeSync, existsSync, openSync, readdirSync, readlinkSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { Access, type Device } from '../../dist/index.js'
import { native } from '../../dist/native/addon.js' // the addon's test hooks
import { ALL_ACCESS, testDevice } from './helpers.js'
import { needs } from './needs.js'
import { countResources } from './resources.js'

const hooks = native as unknown as {
  __testOnlyVgemDmabuf(cardPath: string, size: number): { fd: number; size: number }
}
const SIZE = 65536
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')

let device: Device
let dmabuf: { fd: number; size: number }
beforeAll(() => {
  device = testDevice()
  if (!existsSync('/sys/module/vgem')) spawnSync('modprobe', ['vgem'], { stdio: 'inherit', timeout: 60_000 })
  const cards = existsSync('/sys/devices/platform/vgem/drm') ? readdirSync('/sys/devices/platform/vgem/drm').filter((n) => /^card\d+$/.test(n)) : []
  if (cards.length !== 1) throw new Error('these tests need the vgem driver (modprobe vgem, as root): no /sys/devices/platform/vgem/drm/card*')
  dmabuf = hooks.__testOnlyVgemDmabuf(join('/dev/dri', cards[0]!), SIZE)
})
afterAll(() => {
  if (dmabuf) closeSync(dmabuf.fd)
  device?.close()
})

const isRxe = () => device.name.startsWith('rxe')

describe('registerDmabuf on Soft-RoCE', () => {
  it('the test fd is a real dma-buf of the size asked', () => {
    expect(readlinkSync(`/proc/self/fd/${dmabuf.fd}`)).toMatch(/dmabuf/)
    expect(dmabuf.size).toBe(SIZE)
  })

  needs(process.env.SOFTROCE_DEVICE?.startsWith('rxe') ? undefined : 'SOFTROCE_DEVICE is not a Soft-RoCE device (rxe*); another device may accept dma-bufs')(
    'refuses with EOPNOTSUPP naming the device; nothing stays registered and the PD closes', () => {
      expect(isRxe()).toBe(true)
      const pd = device.allocPd()
      const before = countResources('mr')
      let error: (Error & { code?: string; errno?: number; syscall?: string }) | undefined
      try {
        pd.registerDmabuf(dmabuf.fd, 0, SIZE, ALL_ACCESS)
      } catch (e) {
        error = e as typeof error
      }
      expect(error?.code).toBe('EOPNOTSUPP')
      expect(error?.errno).toBe(95)
      expect(error?.syscall).toBe('ibv_reg_dmabuf_mr')
      expect(error?.message).toContain(device.name)
      expect(countResources('mr')).toBe(before)
      // rxe's provider refuses in user space without looking at the fd (strace: no ioctl), so any fd gets the same answer.
      const devNull = openSync('/dev/null', 'r')
      expect(() => pd.registerDmabuf(devNull, 0, SIZE, ALL_ACCESS)).toThrow(expect.objectContaining({ code: 'EOPNOTSUPP' }))
      closeSync(devNull)
      pd.close() // nothing registered holds it
      expect(pd.closed).toBe(true)
    })

  it('refuses bad arguments with argument errors, before the verb (which answers EOPNOTSUPP here)', () => {
    const pd = device.allocPd()
    const cases: Array<[unknown[], string]> = [
      [[-1, 0, SIZE, Access.LocalWrite], 'ERR_OUT_OF_RANGE'],
      [[1.5, 0, SIZE, Access.LocalWrite], 'ERR_OUT_OF_RANGE'],
      [['3', 0, SIZE, Access.LocalWrite], 'ERR_INVALID_ARG_TYPE'],
      [[dmabuf.fd, -4096, SIZE, Access.LocalWrite], 'ERR_OUT_OF_RANGE'],
      [[dmabuf.fd, 0, 0, Access.LocalWrite], 'ERR_OUT_OF_RANGE'],
      [[dmabuf.fd, 0, 2 ** 53, Access.LocalWrite], 'ERR_OUT_OF_RANGE'],
      [[dmabuf.fd, 0, SIZE, Access.LocalWrite, 100], 'ERR_OUT_OF_RANGE'], // page offset differs from offset's
      [[dmabuf.fd, 0, SIZE, Access.MwBind], 'ERR_OUT_OF_RANGE'], // not a dma-buf access flag
      [[dmabuf.fd, 0, SIZE, Access.RemoteWrite], 'EINVAL'], // RemoteWrite without LocalWrite
      [[dmabuf.fd, 0, SIZE, undefined], 'ERR_INVALID_ARG_TYPE'],
    ]
    const before = countResources('mr')
    for (const [args, code] of cases) {
      expect(() => (pd.registerDmabuf as (...a: unknown[]) => unknown)(...args), JSON.stringify(args)).toThrow(expect.objectContaining({ code }))
    }
    expect(countResources('mr')).toBe(before)
    pd.close()
    expect(() => pd.registerDmabuf(dmabuf.fd, 0, SIZE, Access.LocalWrite)).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }))
  })

  it('without ibv_reg_dmabuf_mr in libibverbs (rdma-core < 34): EOPNOTSUPP saying rdma-core is too old', () => {
    // Hiding the symbol is process-wide and permanent: done in a child.
    const script = `
      import { openDevice, Access } from ${JSON.stringify(pathToFileURL(join(root, 'dist', 'index.js')).href)}
      import { native } from ${JSON.stringify(pathToFileURL(join(root, 'dist', 'native', 'addon.js')).href)}
      const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
      const pd = device.allocPd()
      const found = native.__testOnlyDmabufSymbol(true)
      let result
      try { pd.registerDmabuf(0, 0, 4096, Access.LocalWrite); result = { registered: true } }
      catch (e) { result = { code: e.code, errno: e.errno, message: e.message } }
      pd.close(); device.close()
      console.log(JSON.stringify({ found, ...result }))`
    const out = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 120_000, env: { ...process.env, NODE_IBVERBS_TEST_HOOKS: '1' } })
    expect(out.status, out.stderr).toBe(0)
    const result = JSON.parse(out.stdout.trim().split('\n').pop()!) as { found: string; code: string; errno: number; message: string }
    expect(result.found).toBe('missing')
    expect(result.code).toBe('EOPNOTSUPP')
    expect(result.errno).toBe(95)
    expect(result.message).toContain('rdma-core too old')
  })
})
