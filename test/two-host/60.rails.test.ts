// Two rails between the hosts: the two-host topology gives each guest a second
// wire (its own subnet) with its own rxe device, SOFTROCE_RAIL1_*. First the
// wire itself: rdma_cm across rail 1, on rxe1's PD, moves verified bytes.
import { describe, expect } from 'vitest'
import { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, type Connection, type ConnectionRequest } from '../../dist/index.js'
import { envMissing, needs } from '../rdma/needs.js'
import { ALL_ACCESS, pattern, within } from '../rdma/helpers.js'

const role = process.env.SOFTROCE_HOST_INDEX
const test = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_RAIL1_DEVICE', 'SOFTROCE_RAIL1_ADDR', 'SOFTROCE_RAIL1_PEER_ADDR'))
const WIRE_PORT = 7481

describe(`two rails (this is host ${role})`, () => {
  test('the second wire: rdma_cm on rxe1 across rail 1 moves verified bytes', async () => {
    const device = openDevice(process.env.SOFTROCE_RAIL1_DEVICE!)
    expect(device.name).toBe(process.env.SOFTROCE_RAIL1_DEVICE)
    expect(device.name).not.toBe(process.env.SOFTROCE_DEVICE)
    const pd = device.allocPd()
    const data = pattern(65536, 61)
    try {
      if (role === '0') {
        const region = pd.allocRegion(65536, ALL_ACCESS)
        const listener = await listen({ host: process.env.SOFTROCE_RAIL1_ADDR!, port: WIRE_PORT, pd })
        try {
          const request = await within(new Promise<ConnectionRequest>((resolve) => listener.once('request', resolve)), 120_000, 'the peer to connect on rail 1')
          const conn = await request.accept({ pd, privateData: encodeDescriptors([region.describe()]), receiveJson: true })
          expect(await within(conn.receiveJson(), 60_000, 'the peer to say it wrote')).toEqual({ wrote: 65536 })
          expect(Buffer.compare(region.bytes, data), 'what rail 1 delivered').toBe(0)
          await conn.sendJson({ checked: true })
          await within(new Promise((resolve) => conn.once('disconnected', resolve)), 60_000, 'the peer to disconnect')
          conn.close()
        } finally {
          listener.close()
          region.deregister()
        }
      } else {
        let conn: Connection | undefined
        for (let attempt = 0; !conn; attempt++) {
          try {
            conn = await connect({ host: process.env.SOFTROCE_RAIL1_PEER_ADDR!, port: WIRE_PORT, pd, receiveJson: true, timeoutMs: 30_000 })
          } catch (error) {
            if ((error as { code?: string }).code !== 'ECONNREFUSED' || attempt > 120) throw error
            await new Promise((resolve) => setTimeout(resolve, 500))
          }
        }
        const local = pd.allocRegion(65536, Access.LocalWrite)
        local.bytes.set(data)
        const remote = remoteRegion(decodeDescriptors(conn.privateData)[0]!)
        await conn.qp.write(local.slice(0, 65536), remote.slice(0, 65536))
        await conn.sendJson({ wrote: 65536 })
        expect(await within(conn.receiveJson(), 60_000, 'the peer to check')).toEqual({ checked: true })
        await conn.disconnect()
        local.deregister()
      }
    } finally {
      device.close()
    }
  })
})
