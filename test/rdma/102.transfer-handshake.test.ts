// Handshake failures are coded errors within their bound, never crashes: no
// listener, a listener that is not an agent and never answers, a stranger's
// connect request to an agent, a peer that speaks nonsense.
import { existsSync, readFileSync } from 'node:fs'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { connect, listDevices, listen, RdmaError, TransferAgent, type Connection, type Listener } from '../../dist/index.js'
import { testDevice, waitWithoutLoop, within } from './helpers.js'
import { needs } from './needs.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
let agent: TransferAgent
const handshakeErrors: unknown[] = []

beforeAll(async () => {
  agent = await TransferAgent.create({ host, port: 0, name: 'hs', handshakeTimeoutMs: 30_000 })
  agent.on('handshakeError', (error) => handshakeErrors.push(error))
})
afterAll(() => agent?.close())

// rxe counts the RNR NAKs its responders send (a SEND that found no receive posted).
const deviceName = process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE ?? listDevices()[0]?.name
const rnrCounter = `/sys/class/infiniband/${deviceName}/ports/1/hw_counters/send_rnr_err`
const rnrNaks = (): number => Number(readFileSync(rnrCounter, 'utf8'))

describe('transfer handshake failures', () => {
  it('no listener at the address: a coded error, at once', async () => {
    // A port nobody listens on: take a free one, then close it.
    const probe = await listen({ host, port: 0 })
    const port = probe.address!.port
    probe.close()
    const error = await within(agent.connect({ host, port, timeoutMs: 5000 }).catch((e) => e), 10_000, 'connect to a closed port')
    expect(error).toBeInstanceOf(RdmaError)
    expect(['ECONNREFUSED', 'EHOSTUNREACH', 'ETIMEDOUT', 'CONNECT_ERROR']).toContain(error.code)
  })

  it('a listener that accepts but never speaks the protocol: ETIMEDOUT within the bound, resources released', async () => {
    const device = testDevice()
    const pd = device.allocPd()
    const mute: Listener = await listen({ host, port: 0, pd })
    const accepted: Connection[] = []
    mute.on('request', (request) => { request.accept({ receiveJson: true }).then((c: Connection) => accepted.push(c), () => undefined) })
    try {
      const error = await within(agent.connect({ host, port: mute.address!.port, timeoutMs: 2000 }).catch((e) => e), 60_000, 'connect to a mute listener')
      expect(error).toBeInstanceOf(RdmaError)
      expect(error.code).toBe('ETIMEDOUT')
      expect(agent.peers.size).toBe(0)
    } finally {
      for (const c of accepted) c.close()
      mute.close()
      device.close()
    }
  })

  it('a stranger connecting to the agent (no protocol tag) is refused; the agent keeps serving', async () => {
    const error = await within(connect({ host, port: agent.port, timeoutMs: 5000 }).catch((e) => e), 10_000, 'a stranger\'s connect')
    expect(error).toMatchObject({ code: 'ECONNREFUSED' })
    await within((async () => { while (handshakeErrors.length === 0) await new Promise((r) => setTimeout(r, 10)) })(), 5000, 'the handshakeError event')
    expect(handshakeErrors[0]).toMatchObject({ code: 'ERR_TRANSFER_PROTOCOL' })
    // Still serving: a real agent connects and moves bytes.
    const other = await TransferAgent.create({ host, port: 0, name: 'other' })
    try {
      const seg = agent.register('hs-seg', { size: 4096, remote: 'write' })
      const src = other.register('src', { size: 4096 })
      src.bytes.fill(7)
      const peer = await other.connect({ host, port: agent.port, timeoutMs: 10_000 })
      await other.write(peer, [{ local: [src, 0], remote: ['hs-seg', 0], length: 4096 }], { timeoutMs: 10_000 })
      expect([...seg.bytes].every((b) => b === 7)).toBe(true)
      await agent.unregister(seg)
    } finally {
      other.close()
    }
  })

  it('a peer that sends a malformed hello is refused with ERR_TRANSFER_PROTOCOL (on the listening side), and its connection closed', async () => {
    const before = handshakeErrors.length
    const conn = await connect({ host, port: agent.port, timeoutMs: 5000, privateData: Buffer.from('NIBT2'), receiveJson: true })
    const closed = new Promise((resolve) => conn.once('disconnected', resolve))
    await conn.sendJson({ t: 'hello', p: 2, agent: 'x', name: 'x', qps: [] })
    await within(closed, 10_000, 'the agent to drop the connection')
    conn.close()
    await within((async () => { while (handshakeErrors.length === before) await new Promise((r) => setTimeout(r, 10)) })(), 5000, 'the handshakeError event')
    expect(handshakeErrors[before]).toMatchObject({ code: 'ERR_TRANSFER_PROTOCOL' })
  })

  it('an agent closed just as a peer\'s handshake completes drops that connection: no unhandled error, no peer', async () => {
    const closing = await TransferAgent.create({ host, port: 0, name: 'closing' })
    const device = testDevice()
    const pd = device.allocPd()
    const cq = device.createCq()
    const dataQp = pd.createQp({ type: 'RC', sendCq: cq })
    const unhandled: unknown[] = []
    const onUnhandled = (reason: unknown) => unhandled.push(reason)
    process.on('unhandledRejection', onUnhandled)
    const emitted: string[] = []
    closing.on('peer', () => emitted.push('peer'))
    closing.on('handshakeError', () => emitted.push('handshakeError'))
    const conn = await connect({ host, port: closing.port, pd, timeoutMs: 5000, privateData: Buffer.from('NIBT2'), receiveJson: true })
    try {
      // The agent's side of the protocol, by hand: hello, its welcome and table, then this side's table.
      await conn.sendJson({ t: 'hello', p: 2, agent: 'by-hand', name: 'by-hand', qps: [dataQp.endpoint()] })
      expect(await within(conn.receiveJson(), 10_000, 'welcome')).toMatchObject({ t: 'welcome' })
      expect(await within(conn.receiveJson(), 10_000, 'table')).toMatchObject({ t: 'add', end: true })
      const dropped = new Promise((resolve) => conn.once('disconnected', resolve))
      const waiting = conn.cq.pending
      void conn.sendJson({ t: 'add', v: 0, seg: [], end: true })
      // Acknowledged, unseen by the agent's loop: closing the agent now delivers it, and its handshake completes.
      waitWithoutLoop(() => { conn.cq.poll(); return conn.cq.pending === waiting }, 10_000)
      closing.close()
      await within(dropped, 10_000, 'the closed agent to drop the connection')
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(unhandled).toEqual([])
      expect(emitted).toEqual([])
    } finally {
      process.off('unhandledRejection', onUnhandled)
      conn.close()
      closing.close()
      device.close()
    }
  })

  needs(existsSync(rnrCounter) ? undefined : `no RNR counter at ${rnrCounter} (rxe has one)`)('a handshake sends nothing the peer has no receive posted for (no RNR NAK): no 655 ms RNR retry in the handshake', async () => {
    // A SEND that finds no receive is retried after the responder's RNR timer
    // (655 ms as rdma_cm sets it): every connect paid it, and the listening
    // side finished its handshake after the connecting side had started
    // transferring.
    const other = await TransferAgent.create({ host, port: 0, name: 'rnr' })
    try {
      const before = rnrNaks()
      const peer = await other.connect({ host, port: agent.port, timeoutMs: 30_000 })
      await within((async () => { while (![...agent.peers.values()].some((p) => p.name === 'rnr')) await new Promise((r) => setTimeout(r, 5)) })(), 30_000, 'the listening side to finish its handshake')
      expect(rnrNaks() - before).toBe(0)
      other.closePeer(peer)
    } finally {
      other.close()
    }
  })
})
