// Device async events, UC queue pairs and type 1 memory windows.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { execFileSync } from 'node:child_process'
import { Access, RemoteRegion, type AsyncEvent, type Device } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, pattern, srqPair, testDevice } from './helpers.js'
import { envMissing, needs } from './needs.js'

let device: Device
beforeAll(() => { device = testDevice() })
afterAll(() => device?.close())

function nextEvent(type: string, timeoutMs = 20_000): Promise<AsyncEvent> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${type} event within ${timeoutMs} ms`)), timeoutMs)
    const listener = (event: AsyncEvent) => {
      if (event.type !== type) return
      clearTimeout(timer)
      device.off('async', listener)
      resolve(event)
    }
    device.on('async', listener)
  })
}

describe('device async events', () => {
  it('SRQ_LIMIT_REACHED fires when an armed SRQ runs low', async () => {
    const { srq, region, receiver, sender, close } = await srqPair(device)
    try {
      const receives = Array.from({ length: 4 }, (_, i) => srq.recv(region.slice(i * 64, 64)))
      receives[3]!.catch(() => {}) // still posted when the SRQ closes
      srq.arm(2)
      const limit = nextEvent('SRQ_LIMIT_REACHED')
      for (let i = 0; i < 3; i++) await sender.send(region.slice(1024, 8))
      await Promise.all(receives.slice(0, 3))
      const event = await limit
      expect(event.srq).toBe(srq)
    } finally {
      close()
    }
  })

  // Takes the netdev down and up: only in the throwaway guest.
  const inGuest = process.env.SOFTROCE_MODE === 'vm' ? envMissing('SOFTROCE_NETDEV') : 'takes the netdev down and up: only in the throwaway QEMU guest (SOFTROCE_MODE=vm)'
  needs(inGuest)('PORT_ERR and PORT_ACTIVE follow the link of the netdev', async () => {
    const netdev = process.env.SOFTROCE_NETDEV!
    const down = nextEvent('PORT_ERR')
    execFileSync('ip', ['link', 'set', netdev, 'down'])
    try {
      expect((await down).port).toBe(1)
      expect(device.queryPort(1).state).not.toBe('ACTIVE')
    } finally {
      const up = nextEvent('PORT_ACTIVE')
      execFileSync('ip', ['link', 'set', netdev, 'up'])
      expect((await up).port).toBe(1)
    }
    expect(device.queryPort(1).state).toBe('ACTIVE')
  })
})

describe('more transports and windows', () => {
  it('UC queue pairs WRITE and SEND (no READ: refused locally)', async () => {
    const { a, b, close } = await connectedPair(device, { qp: { type: 'UC' } })
    try {
      a.region.bytes.set(pattern(4096, 12))
      await a.qp.write(a.region.slice(0, 4096), b.region.asRemote().slice(8192, 4096))
      expect(Buffer.compare(b.region.bytes.subarray(8192, 12288), pattern(4096, 12))).toBe(0)
      const received = b.qp.recv(b.region.slice(0, 64))
      await a.qp.send(a.region.slice(0, 64))
      expect((await received).byteLength).toBe(64)
      await expect(a.qp.read(a.region.slice(0, 8), b.region.asRemote().slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_TYPE' })
    } finally {
      close()
    }
  })

  it('a type 1 memory window grants access until it is deallocated', async () => {
    const { a, b, close } = await connectedPair(device, { access: ALL_ACCESS | Access.MwBind })
    try {
      const window = b.pd.allocMemoryWindow(1)
      const granted = await b.qp.bindWindow(window, b.region.slice(8192, 4096), Access.RemoteWrite)
      const remote = new RemoteRegion(BigInt(granted.addr), granted.rkey, granted.length)
      a.region.bytes.fill(0x33, 0, 64)
      await a.qp.write(a.region.slice(0, 64), remote.slice(0, 64))
      expect(b.region.bytes[8192]).toBe(0x33)
      // (rxe on Linux 6.1 checks the region's range, not the window's: a
      // write past the window but inside the region is accepted there.)
      window.close()
      await expect(a.qp.write(a.region.slice(0, 64), remote.slice(64, 64))).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
      expect(b.region.bytes[8192 + 64]).toBe(0)
    } finally {
      close()
    }
  })
})
