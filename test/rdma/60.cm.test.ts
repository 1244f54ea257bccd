// rdma_cm connections between processes: descriptors in private data, data
// verified both ways, rejections, refusals, timeouts, a peer killed mid-transfer,
// and many connections to one listener.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Access, connect, decodeDescriptors, encodeDescriptors, listen, RdmaError, remoteRegion, type Device, type ProtectionDomain } from '../../dist/index.js'
import { testDevice } from './helpers.js'
import { exchange, startServer, type ServerProcess } from './cm-helpers.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
let device: Device
let pd: ProtectionDomain
let server: ServerProcess

beforeAll(async () => {
  device = testDevice()
  pd = device.allocPd()
  server = await startServer(host)
})
afterAll(async () => {
  await server?.stop()
  device?.close()
})

describe('rdma_cm with a server in another process', () => {
  it('connects, gets the descriptor in private data, and moves verified bytes with WRITE, READ and SEND/RECV', async () => {
    const conn = await exchange(host, server.port, pd, 1)
    expect(conn.qp.state).toBe('RTS')
    expect(conn.remoteAddress).toMatchObject({ address: host, port: server.port })
    await conn.sendJson({ echo: 'ping' })
    expect(await conn.receiveJson()).toMatchObject({ echo: 'ping' })
    await conn.disconnect()
    expect(conn.closed).toBe(true)
  })

  it('64 connections to one listener each move verified data', async () => {
    const conns = []
    for (let wave = 0; wave < 4; wave++) {
      conns.push(...await Promise.all(Array.from({ length: 16 }, (_, i) => exchange(host, server.port, pd, 100 + wave * 16 + i))))
    }
    expect(conns.length).toBe(64)
    expect(new Set(conns.map((c) => c.qp.qpn)).size).toBe(64)
    await Promise.all(conns.map((c) => c.disconnect()))
  })

  it('a peer killed mid-transfer: pending requests reject, new ones are refused, nothing hangs', async () => {
    const victim = await startServer(host)
    const conn = await connect({ host, port: victim.port, pd, receiveJson: true })
    const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
    const local = pd.allocRegion(65536)
    const disconnected = new Promise((resolve) => conn.once('disconnected', resolve))
    const pendingReceive = conn.qp.recv(local.slice(0, 64))
    const writes = Array.from({ length: 200 }, () => conn.qp.write(local.slice(0, 65536), remote.slice(0, 65536)).then(() => 'ok', (e) => e))
    victim.child.kill('SIGKILL')
    const receiveError = await pendingReceive.catch((e) => e)
    expect(receiveError).toBeInstanceOf(RdmaError)
    const outcomes = await Promise.all(writes)
    expect(outcomes.filter((o) => o !== 'ok').every((o) => o instanceof RdmaError)).toBe(true)
    await disconnected
    await expect(conn.qp.write(local.slice(0, 8), remote.slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
    conn.close()
    local.deregister()
  })
})

describe('rdma_cm over IPv6', () => {
  // The environment puts an IPv6 address on the device's netdev (always in the guest).
  const host6 = process.env.SOFTROCE_ADDR6
  it.runIf(host6 !== undefined || process.env.SOFTROCE_MODE === 'vm')('connects and moves verified data over IPv6', async () => {
    expect(host6, 'SOFTROCE_ADDR6').toBeDefined()
    const v6 = await startServer(host6!)
    try {
      const conn = await exchange(host6!, v6.port, pd, 6)
      expect(conn.remoteAddress).toMatchObject({ family: 'IPv6', address: host6 })
      await conn.disconnect()
    } finally {
      await v6.stop()
    }
  })
})

describe('rdma_cm failures are typed errors', () => {
  it('a listener rejects with private data; the client sees ECONNREFUSED with it', async () => {
    const listener = await listen({ host, port: 0 })
    listener.on('request', (request) => {
      expect(decodeDescriptors(request.privateData)[0]).toMatchObject({ rkey: 7, length: 64 })
      request.reject({ privateData: Buffer.from('busy, try later') })
    })
    const error = await connect({ host, port: listener.address!.port, privateData: encodeDescriptors([{ addr: '0x1000', rkey: 7, length: 64 }]) }).catch((e) => e)
    listener.close()
    expect(error).toBeInstanceOf(RdmaError)
    expect(error.code).toBe('ECONNREFUSED')
    expect(Buffer.from(error.privateData).subarray(0, 15).toString()).toBe('busy, try later')
  })

  it('connecting to a port nobody listens on is refused quickly', async () => {
    const error = await connect({ host, port: 9, timeoutMs: 20_000 }).catch((e) => e)
    expect(error).toMatchObject({ code: 'ECONNREFUSED' })
  })

  it('a listener that never answers: connect times out with ETIMEDOUT', async () => {
    const listener = await listen({ host, port: 0 })
    const error = await connect({ host, port: listener.address!.port, timeoutMs: 1500 }).catch((e) => e)
    listener.close()
    expect(error).toMatchObject({ code: 'ETIMEDOUT' }) // in the connect step, or in resolution on a very loaded machine
  })

  it('an AbortSignal stops a connect', async () => {
    const listener = await listen({ host, port: 0 })
    const controller = new AbortController()
    const connecting = connect({ host, port: listener.address!.port, signal: controller.signal })
    setTimeout(() => controller.abort(), 100)
    await expect(connecting).rejects.toMatchObject({ code: 'ABORT_ERR' })
    listener.close()
  })

  it('bad options are typed errors', async () => {
    await expect(connect({ host, port: 70000 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    await expect(connect({ host: 42 as never, port: 1 })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    await expect(connect({ host, port: 1, privateData: Buffer.alloc(57) })).rejects.toThrow(RangeError)
    await expect(listen({ host: 'not an address at all', port: 1 })).rejects.toThrow()
  })

  it('without a PD, a connection opens its device and a PD of its own', async () => {
    const listener = await listen({ host, port: 0, pd })
    listener.on('request', (request) => request.accept().catch(() => {}))
    const conn = await connect({ host, port: listener.address!.port })
    expect(conn.pd).not.toBe(pd)
    expect(conn.device.name).toBe(device.name)
    // the connection's own PD works for memory of its own
    const region = conn.pd.allocRegion(64, Access.LocalWrite)
    expect(region.lkey).toBeGreaterThan(0)
    await conn.disconnect()
    listener.close()
  })
})
