// The transfer engine between two agents on the device. The behaviour every
// transport shares (random layouts and blocks, notifications, concurrency,
// rights, withdrawal, bounds) is test/engine/transfer-suite.ts, run here with
// 'rdma' (test/unit/93 runs it with 'tcp'); what is RDMA's own follows:
// the QPs asked for, the device refusing a forged block, the ACK timeout.
import { describe, expect, it } from 'vitest'
import { TransferAgent, TransferError } from '../../dist/index.js'
import { engineAgents, engineTests } from '../engine/transfer-suite.js'
import { until, within, type EngineEnv } from '../engine/util.js'

const env: EngineEnv = { transport: 'rdma', host: process.env.SOFTROCE_ADDR ?? '198.18.0.1' }
const host = env.host
const ctx = engineAgents(env)
engineTests(env, ctx)

describe('RDMA: QPs, the device\'s enforcement, the ACK timeout', () => {
  it('connects with the QPs asked for', () => {
    ctx.clients.forEach(({ peer }, i) => {
      expect((peer as unknown as { link: { qps: unknown[] } }).link.qps.length).toBe(i + 1)
    })
  })

  it('a forged block (the local check bypassed) is refused by the device: coded error, 0 bytes landed, memory untouched; the next transfer reconnects with fresh QPs', async () => {
    const { server, clients } = ctx
    const { agent, peer } = clients[1]!
    const local = agent.register('f-local', { size: 8192 })
    const ro = server.register('f-ro', { size: 8192, remote: 'read' })
    const rw = server.register('f-rw', { size: 8192, remote: 'read-write' })
    await until(() => peer.segments.has('f-ro') && peer.segments.has('f-rw'), 'the client to see f-ro')
    ro.bytes.fill(5)
    local.bytes.fill(9)
    // Forge: make this side's copy of the peer's table claim write rights (its rkey has none).
    const link = (peer as unknown as { link: { remote: { byName: Map<string, { rights: string }> }; qps: Array<{ qpn: number }> } }).link
    link.remote.byName.get('f-ro')!.rights = 'read-write'
    const qpnsBefore = link.qps.map((qp) => qp.qpn)
    const reconnectsBefore = agent.stats().peers[peer.id]!.reconnects
    const error = await within(agent.write(peer, [{ local: [local, 0], remote: ['f-ro', 0], length: 4096 }], { timeoutMs: 20_000 }).catch((e) => e), 25_000, 'forged write')
    expect(error).toBeInstanceOf(TransferError)
    expect(error.code).toBe('REM_ACCESS_ERR')
    expect(error.bytesLanded).toBe(0)
    expect(error.bytes).toBe(4096)
    expect([...ro.bytes].every((b) => b === 5), 'the read-only segment is untouched').toBe(true)
    expect(peer.state).toBe('broken')
    // The next transfer gets a fresh link: new QPs, the peer's table anew (with the true rights).
    await within(agent.write(peer, [{ local: [local, 0], remote: ['f-rw', 0], length: 4096 }], { timeoutMs: 20_000 }), 25_000, 'write after the forgery')
    expect([...rw.bytes.subarray(0, 4096)].every((b) => b === 9)).toBe(true)
    const fresh = (peer as unknown as { link: { qps: Array<{ qpn: number }> } }).link.qps.map((qp) => qp.qpn)
    expect(fresh.some((qpn) => qpnsBefore.includes(qpn)), 'no QP reused').toBe(false)
    expect(peer.segments.get('f-ro')?.rights).toBe('read')
    expect(agent.stats().peers[peer.id]!.reconnects).toBe(reconnectsBefore + 1)
    await Promise.all([server.unregister(ro), server.unregister(rw), agent.unregister(local)])
  })

  it('ackTimeout sets the ACK timeout of the data QPs the agent makes (default 14); values that are not an exponent 0..31 are refused with a code', async () => {
    type Qps = { link: { qps: Array<{ query(): Record<string, unknown> }> } }
    const agent = await TransferAgent.create({ host, port: 0, name: 'ack-timeout', qpsPerPeer: 2, ackTimeout: 18 })
    try {
      const peer = await agent.connect({ host, port: ctx.server.port, timeoutMs: 20_000 })
      const qps = (peer as unknown as Qps).link.qps
      expect(qps.map((qp) => qp.query().timeout)).toEqual([18, 18])
      // An agent without the option keeps the verbs default of connect().
      expect((ctx.clients[1]!.peer as unknown as Qps).link.qps.map((qp) => qp.query().timeout)).toEqual([14, 14])
    } finally {
      agent.close()
    }
    for (const [value, code] of [[32, 'ERR_OUT_OF_RANGE'], [-1, 'ERR_OUT_OF_RANGE'], [1.5, 'ERR_OUT_OF_RANGE'], ['18', 'ERR_INVALID_ARG_TYPE']] as const) {
      await expect(TransferAgent.create({ host, port: 0, ackTimeout: value as number }), String(value)).rejects.toMatchObject({ code })
    }
  })
})
