import { describe, expect, it } from 'vitest'
import { listDevices, openDevice, RdmaError } from '../../dist/index.js'
import { native } from '../../dist/native/addon.js'
import { internals } from '../internals.js'
import { testDevice } from './helpers.js'
import { envMissing, needs } from './needs.js'
import { kernelDevices } from '../unit/kernel-devices.js'

describe('devices on Soft-RoCE', () => {
  needs(envMissing('SOFTROCE_DEVICE'))('lists the rxe device', () => {
    const names = listDevices().map((d) => d.name)
    expect(names).toContain(process.env.SOFTROCE_DEVICE)
  })

  it('lists exactly the devices the kernel has (sysfs), with their GUIDs and node types', () => {
    const devices = listDevices()
    expect(devices.length).toBeGreaterThan(0)
    const listed = devices.map(({ name, guid, nodeType }) => ({ name, guid, nodeType })).sort((a, b) => a.name.localeCompare(b.name))
    expect(listed).toEqual(kernelDevices())
    for (const d of devices) expect(d.transport).toBe('IB') // rxe, InfiniBand and RoCE NICs all use the IB transport
  })

  it('opens the device and reports an ACTIVE Ethernet port with RoCE v2 GIDs', () => {
    const device = testDevice()
    try {
      const attrs = device.query()
      expect(attrs.physPortCount).toBeGreaterThanOrEqual(1)
      expect(attrs.maxQp).toBeGreaterThan(0)
      expect(typeof attrs.maxMrSize).toBe('bigint')
      const port = device.queryPort(1)
      expect(port.state).toBe('ACTIVE')
      expect(port.linkLayer).toBe('Ethernet')
      expect([256, 512, 1024, 2048, 4096]).toContain(port.activeMtu)
      const gids = device.gids(1)
      expect(gids.length).toBeGreaterThan(0)
      for (const g of gids) expect(['IB', 'RoCEv1', 'RoCEv2']).toContain(g.type)
    } finally {
      device.close()
    }
  })

  needs(envMissing('SOFTROCE_ADDR', 'SOFTROCE_NETDEV'))('has a RoCE v2 GID for the netdev\'s IPv4 address, and uses it by default', () => {
    const device = testDevice()
    try {
      const addr = process.env.SOFTROCE_ADDR
      const gids = device.gids(1)
      const v4 = gids.find((g) => g.gid === `::ffff:${addr}`)
      expect(v4, `a GID ::ffff:${addr} in ${JSON.stringify(gids)}`).toBeDefined()
      expect(v4!.type).toBe('RoCEv2')
      expect(v4!.netdev).toBe(process.env.SOFTROCE_NETDEV)
      expect(device.defaultGidIndex(1)).toBe(v4!.index)
    } finally {
      device.close()
    }
  })

  it('names the devices that exist when asked for a missing one', () => {
    let error: unknown
    try { openDevice('no_such_device') } catch (e) { error = e }
    expect(error).toBeInstanceOf(RdmaError)
    expect((error as RdmaError).code).toBe('ENODEV')
    for (const d of listDevices()) expect((error as Error).message).toContain(d.name)
  })

  it('rejects a port number out of range with a typed error', () => {
    const device = testDevice()
    try {
      expect(() => device.queryPort(0)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
      expect(() => device.queryPort(9)).toThrow(RdmaError)
    } finally {
      device.close()
    }
  })

  // The native constructor checks its PD argument first, so this needs a real PD.
  it('refuses a released NativeBuffer as the memory of a region (ERR_CLOSED), and registers a live one', () => {
    const device = testDevice()
    const pd = device.allocPd()
    try {
      const live = new native.NativeBuffer(4096)
      const region = new native.MemoryRegion(internals(pd).handle, live, 1)
      expect(region.info().length).toBe(4096)
      region.close()
      const released = new native.NativeBuffer(4096)
      released.release()
      let error: { code?: string; message?: string } | undefined
      try { new native.MemoryRegion(internals(pd).handle, released, 1) } catch (e) { error = e as Error }
      expect(error).toMatchObject({ code: 'ERR_CLOSED', message: 'NativeBuffer is released' })
    } finally {
      pd.close()
      device.close()
    }
  })
})
