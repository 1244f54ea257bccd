import { describe, expect, it } from 'vitest'
import { listDevices, openDevice, RdmaError } from '../../dist/index.js'
import { testDevice } from './helpers.js'

describe('devices on Soft-RoCE', () => {
  it('lists the rxe device', () => {
    const names = listDevices().map((d) => d.name)
    expect(names.length).toBeGreaterThan(0)
    if (process.env.SOFTROCE_DEVICE) expect(names).toContain(process.env.SOFTROCE_DEVICE)
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
      const addr = process.env.SOFTROCE_ADDR
      if (addr) {
        const v4 = gids.find((g) => g.gid === `::ffff:${addr}`)
        expect(v4, `a GID ::ffff:${addr} in ${JSON.stringify(gids)}`).toBeDefined()
        expect(v4!.type).toBe('RoCEv2')
        if (process.env.SOFTROCE_NETDEV) expect(v4!.netdev).toBe(process.env.SOFTROCE_NETDEV)
        expect(device.defaultGidIndex(1)).toBe(v4!.index)
      }
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
})
