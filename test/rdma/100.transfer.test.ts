// The transfer engine between two agents on the device. The behaviour every
// transport shares (random layouts and blocks, notifications, concurrency,
// rights, withdrawal, bounds) is test/engine/transfer-suite.ts, run here with
// 'rdma' (test/unit/93 runs it with 'tcp'); what is RDMA's own follows:
// the QPs asked for, the device refusing a forged block, the ACK timeout.
import { describe, expect, it } from 'vitest'
import { Access, TransferAgent, TransferError, type MemoryRegion } from '../../dist/index.js'
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

  it('a timed-out unregister() still withdraws the memory: once no work request names it, the old rkey is refused by the device (REM_ACCESS_ERR), the bytes untouched', async () => {
    const { server } = ctx
    const agent = await TransferAgent.create({ host, port: 0, name: 'held-client', qpsPerPeer: 1 })
    // Something of the server's own holds the segment's memory region: a receive naming it, on a QP nothing sends to.
    const cq = server.device!.createCq({ entries: 4 })
    const qp = server.pd!.createQp({ type: 'RC', sendCq: cq, maxSendWr: 1, maxRecvWr: 1 })
    qp.modify('INIT', { pkeyIndex: 0, portNum: 1, accessFlags: Access.LocalWrite })
    try {
      const peer = await agent.connect({ host, port: server.port, timeoutMs: 20_000 })
      const mine = Buffer.alloc(8192, 7)
      const held = server.register('held', { memory: mine, remote: 'read-write' })
      const { addr, rkey } = (held.region as MemoryRegion).describe()
      await until(() => peer.segments.has('held'), 'the client to see held')
      const pending = qp.recv((held.region as MemoryRegion).slice(0, 64)).catch((e: unknown) => e)
      const timedOut = await server.unregister(held, { timeoutMs: 50 }).catch((e: unknown) => e)
      expect(timedOut).toMatchObject({ code: 'ETIMEDOUT' })
      await until(() => !peer.segments.has('held'), 'the withdrawal to reach the client')
      // No longer in use: closing the QP gives the receive back (it is rejected as closed).
      qp.close()
      expect(await within(pending, 10_000, 'the receive of the closed QP')).toMatchObject({ code: expect.stringMatching(/^(ERR_CLOSED|WR_FLUSH_ERR)$/) })
      await until(() => (held.region as MemoryRegion).inflight === 0, 'no work request to name the region')
      // Deregistered then (after the client's release answer, too): asynchronously, so wait for it.
      await until(() => (held.region as MemoryRegion).closed, 'the withdrawn region to be deregistered')
      const src = agent.register('held-src', { size: 8192 })
      src.bytes.fill(9)
      // Forge the client's table back to the withdrawn entry, with its old rkey: the device is asked to write and read there.
      type Forge = { link: { remote: { add(entries: unknown[], version: number, lanes: number): void } } }
      const forge = () => (peer as unknown as Forge).link.remote.add([['held', addr, rkey, 8192, 'read-write']], 1e9, 2)
      forge()
      const written = await within(agent.write(peer, [{ local: [src, 0], remote: ['held', 0], length: 8192 }], { timeoutMs: 20_000 }).catch((e: unknown) => e), 25_000, 'the write with the old rkey')
      expect(written, 'a WRITE with the withdrawn rkey').toMatchObject({ code: 'REM_ACCESS_ERR', bytesLanded: 0 })
      expect([...mine].every((b) => b === 7), 'the withdrawn memory is untouched').toBe(true)
      // The link broke on the refusal: the read reconnects (a fresh table without 'held'), then is forged again.
      await within(agent.write(peer, [{ local: [src, 0], remote: ['nothing-here', 0], length: 1 }]).catch(() => undefined), 25_000, 'a reconnect')
      await until(() => peer.state === 'connected', 'the client to reconnect')
      forge()
      const read = await within(agent.read(peer, [{ local: [src, 0], remote: ['held', 0], length: 8192 }], { timeoutMs: 20_000 }).catch((e: unknown) => e), 25_000, 'the read with the old rkey')
      expect(read, 'a READ with the withdrawn rkey').toMatchObject({ code: 'REM_ACCESS_ERR', bytesLanded: 0 })
      expect([...src.bytes].every((b) => b === 9), 'nothing of the withdrawn memory was read').toBe(true)
    } finally {
      qp.close()
      cq.close()
      agent.close()
    }
  })

  it('pollMode \'busy\' polls the data CQs of the links it makes (a notified write arrives, its data in place); another value is refused with a code', async () => {
    type Cq = { link: { cq: { pollMode: string } } }
    const agent = await TransferAgent.create({ host, port: 0, name: 'busy-poll', qpsPerPeer: 2, pollMode: 'busy' })
    try {
      const peer = await agent.connect({ host, port: ctx.server.port, timeoutMs: 20_000 })
      expect((peer as unknown as Cq).link.cq.pollMode).toBe('busy')
      expect((ctx.clients[1]!.peer as unknown as Cq).link.cq.pollMode, 'the default').toBe('event')
      const src = agent.register('busy-src', { size: 4096 })
      const dst = ctx.server.register('busy-dst', { size: 4096, remote: 'write' })
      await until(() => peer.segments.has('busy-dst'), 'the client to see busy-dst')
      src.bytes.fill(0x5a)
      const arrived = new Promise<boolean>((resolve) => ctx.server.once('notification', ({ message }) => resolve(message === 'busy' && dst.bytes.every((b) => b === 0x5a))))
      await agent.write(peer, [{ local: [src, 0], remote: ['busy-dst', 0], length: 4096 }], { notify: 'busy', timeoutMs: 20_000 })
      expect(await within(arrived, 10_000, 'the notification'), 'the data was in place in the handler').toBe(true)
      await ctx.server.unregister(dst)
    } finally {
      agent.close()
    }
    await expect(TransferAgent.create({ host, port: 0, pollMode: 'spin' as 'busy' })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
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
