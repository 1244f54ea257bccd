// The transfer engine over TCP, on loopback with no device: the engine's
// shared suites (test/engine/) with transport 'tcp', then what is TCP's own:
// the receiving agent's code refuses what a NIC would (a forged block: rights,
// bounds, a withdrawn segment) with the code the RDMA path gives, leaving the
// bytes untouched; a socket that skips the handshake is served nothing;
// 'auto' says when it falls back to TCP; an unknown transport is refused.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { connect } from 'node:net'
import { TransferAgent, TransferError, type Peer } from '../../dist/index.js'
import { FrameType, head, SLICE, writeSlice } from '../../lib/transfer/tcp/frames.js'
import { engineAgents, engineTests } from '../engine/transfer-suite.js'
import { peerDeathTests, progressTests } from '../engine/peer-suite.js'
import { resumeTests } from '../engine/resume-suite.js'
import { until, within, type EngineEnv } from '../engine/util.js'
import { needs } from '../rdma/needs.js'
import { etcdBinary, startEtcd, type EtcdServer } from '../../scripts/etcd-server.mjs'

const env: EngineEnv = { transport: 'tcp', host: '127.0.0.1' }
const host = env.host
const ctx = engineAgents(env)
engineTests(env, ctx)
peerDeathTests(env)
progressTests(env)
resumeTests(env)

type ForgedTable = { link: { remote: { byName: Map<string, { rights: string; length: number }>; add(entries: unknown[], version: number): void } } }
const table = (peer: Peer) => (peer as unknown as ForgedTable).link.remote

describe('TCP: the receiving agent enforces its segments (no NIC does)', () => {
  let server: TransferAgent
  let client: TransferAgent
  let peer: Peer
  beforeAll(async () => {
    server = await TransferAgent.create({ host, transport: 'tcp', name: 'target' })
    client = await TransferAgent.create({ host, transport: 'tcp', name: 'initiator' })
    peer = await client.connect({ host, port: server.port, timeoutMs: 10_000 })
  })
  afterAll(() => {
    client?.close()
    server?.close()
  })

  it('a forged write into a read-only segment, or past its end, is refused with REM_ACCESS_ERR: 0 bytes landed, the bytes untouched, the link carries on', async () => {
    const local = client.register('fw-local', { size: 8192 })
    const ro = server.register('fw-ro', { size: 4096, remote: 'read' })
    const rw = server.register('fw-rw', { size: 4096, remote: 'read-write' })
    await until(() => peer.segments.has('fw-ro') && peer.segments.has('fw-rw'), 'the client to see the segments')
    ro.bytes.fill(5)
    rw.bytes.fill(6)
    local.bytes.fill(9)
    // Forge this side's copy of the peer's table: write rights on 'fw-ro', twice the length of 'fw-rw'.
    table(peer).byName.get('fw-ro')!.rights = 'read-write'
    const forgedLength = table(peer).byName.get('fw-rw')!
    ;(table(peer) as unknown as { lengths: number[] }).lengths[(forgedLength as unknown as { index: number }).index] = 8192
    const rights = await within(client.write(peer, [{ local: [local, 0], remote: ['fw-ro', 0], length: 4096 }], { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'the forged write')
    expect(rights).toBeInstanceOf(TransferError)
    expect(rights).toMatchObject({ code: 'REM_ACCESS_ERR', status: 'REM_ACCESS_ERR', bytesLanded: 0, blocksLanded: 0, bytes: 4096 })
    expect([...ro.bytes].every((b) => b === 5), 'the read-only segment is untouched').toBe(true)
    const bounds = await within(client.write(peer, [{ local: [local, 0], remote: ['fw-rw', 2048], length: 4096 }], { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'the write past the end')
    expect(bounds).toMatchObject({ code: 'REM_ACCESS_ERR', bytesLanded: 0 })
    expect([...rw.bytes].every((b) => b === 6), 'no byte of the write past the end landed').toBe(true)
    // Refused alone: the same link carries the next transfer.
    expect(peer.state).toBe('connected')
    await client.write(peer, [{ local: [local, 0], remote: ['fw-rw', 0], length: 4096 }], { timeoutMs: 10_000 })
    expect([...rw.bytes].every((b) => b === 9)).toBe(true)
    expect(client.stats().peers[peer.id]!.reconnects).toBe(0)
    await Promise.all([server.unregister(ro), server.unregister(rw), client.unregister(local)])
  })

  it('a forged read of a write-only segment is refused: the local destination untouched', async () => {
    const local = client.register('fr-local', { size: 4096 })
    const wo = server.register('fr-wo', { size: 4096, remote: 'write' })
    await until(() => peer.segments.has('fr-wo'), 'the client to see fr-wo')
    wo.bytes.fill(7)
    local.bytes.fill(1)
    table(peer).byName.get('fr-wo')!.rights = 'read-write'
    const error = await within(client.read(peer, [{ local: [local, 0], remote: ['fr-wo', 0], length: 4096 }], { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'the forged read')
    expect(error).toMatchObject({ code: 'REM_ACCESS_ERR', bytesLanded: 0 })
    expect([...local.bytes].every((b) => b === 1), 'nothing of the peer\'s bytes arrived').toBe(true)
    await Promise.all([server.unregister(wo), client.unregister(local)])
  })

  it('a write naming a withdrawn segment (its old key kept) is refused: the memory it had is untouched', async () => {
    const local = client.register('fx-local', { size: 4096 })
    const gone = server.register('fx-gone', { size: 4096, remote: 'read-write' })
    await until(() => peer.segments.has('fx-gone'), 'the client to see fx-gone')
    const key = (gone.region as unknown as { key: number }).key
    gone.bytes.fill(3)
    local.bytes.fill(8)
    await server.unregister(gone)
    await until(() => !peer.segments.has('fx-gone'), 'the withdrawal to reach the client')
    // Forge: put the withdrawn entry back into this side's copy of the table.
    table(peer).add([['fx-gone', '0x0', key, 4096, 'read-write']], 1e9)
    const error = await within(client.write(peer, [{ local: [local, 0], remote: ['fx-gone', 0], length: 4096 }], { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'the write to a withdrawn segment')
    expect(error).toMatchObject({ code: 'REM_ACCESS_ERR', bytesLanded: 0 })
    expect([...gone.bytes].every((b) => b === 3), 'the withdrawn memory is untouched').toBe(true)
    await client.unregister(local)
  })

  it('a socket that sends data frames without the handshake is dropped (ERR_TRANSFER_PROTOCOL) and moves no byte', async () => {
    const target = server.register('raw', { size: 4096, remote: 'read-write' })
    target.bytes.fill(4)
    const key = (target.region as unknown as { key: number }).key
    const refused = new Promise<Error>((resolve) => server.once('handshakeError', resolve))
    const socket = connect({ host, port: server.port })
    await new Promise((resolve) => socket.once('connect', resolve))
    const payload = Buffer.alloc(4096, 0xee)
    const slice = Buffer.alloc(SLICE)
    writeSlice(slice, 0, key, 4096, 0)
    socket.write(Buffer.concat([head(FrameType.WriteBatch, 0, 1, 1, SLICE + 4096), slice, payload]))
    const closed = new Promise((resolve) => socket.once('close', resolve))
    socket.on('error', () => undefined)
    expect(await within(refused, 10_000, 'the handshake error')).toMatchObject({ code: 'ERR_TRANSFER_PROTOCOL' })
    await within(closed, 10_000, 'the socket to be closed')
    expect([...target.bytes].every((b) => b === 4), 'no byte of the raw frame landed').toBe(true)
    await server.unregister(target)
  })

  it('register({ memory }) uses the memory given (no copy): a peer\'s write lands in the caller\'s Buffer', async () => {
    const mine = Buffer.alloc(4096)
    const segment = server.register('given', { memory: mine, remote: 'write' })
    const local = client.register('given-src', { size: 4096 })
    local.bytes.fill(0x5a)
    await until(() => peer.segments.has('given'), 'the client to see given')
    await client.write(peer, [{ local: [local, 0], remote: ['given', 0], length: 4096 }], { timeoutMs: 10_000 })
    expect([...mine].every((b) => b === 0x5a)).toBe(true)
    expect(server.device).toBeUndefined()
    expect(server.pd).toBeUndefined()
    await Promise.all([server.unregister(segment), client.unregister(local)])
  })
})

describe('choosing the transport', () => {
  it("'auto' with no device serving the address runs over TCP and says so once per process (a warning with a code); stats().transport says it", async () => {
    const warnings: Error[] = []
    const onWarning = (w: Error) => warnings.push(w)
    process.on('warning', onWarning)
    try {
      const first = await TransferAgent.create({ host, transport: 'auto' })
      const second = await TransferAgent.create({ host, transport: 'auto' })
      try {
        expect(first.transport).toBe('tcp')
        expect(first.stats().transport).toBe('tcp')
        await until(() => warnings.length > 0, 'the warning', 5_000)
        await new Promise((resolve) => setTimeout(resolve, 50))
        const ours = warnings.filter((w) => (w as { code?: string }).code === 'NODE_IBVERBS_TCP_FALLBACK')
        expect(ours.length, 'one warning for two agents').toBe(1)
        expect(ours[0]!.message).toContain(host)
      } finally {
        first.close()
        second.close()
      }
    } finally {
      process.off('warning', onWarning)
    }
  })

  it('an unknown transport is refused with a code', async () => {
    for (const transport of ['udp', 42, null]) {
      await expect(TransferAgent.create({ host, transport: transport as never })).rejects.toMatchObject({ code: expect.stringMatching(/^ERR_INVALID_ARG_/) })
    }
  })

  it("the default stays 'rdma': it never falls back to TCP by itself", async () => {
    const outcome = await TransferAgent.create({ host }).then((agent) => { const t = agent.transport; agent.close(); return t }, (e: unknown) => e)
    // On a host without a device this is the coded error it always was; with one, an RDMA agent.
    if (typeof outcome === 'string') expect(outcome).toBe('rdma')
    else expect(typeof (outcome as { code?: unknown }).code).toBe('string')
  })
})

describe('TCP agents with cluster metadata (etcd)', () => {
  const withEtcd = needs(etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)")
  let etcd: EtcdServer | undefined
  beforeAll(async () => { if (etcdBinary()) etcd = await startEtcd() }, 90_000)
  afterAll(async () => { await etcd?.stop() })

  withEtcd('connect by name, write, and reach a restarted agent under the same name (a new incarnation) through the same handle', async () => {
    const metadata = { endpoints: [etcd!.endpoint], ttlSeconds: 2, prefix: '/tcp-93/' }
    let decode = await TransferAgent.create({ host, transport: 'tcp', name: 'decode-0', metadata })
    const prefill = await TransferAgent.create({ host, transport: 'tcp', name: 'prefill-0', metadata })
    try {
      let kv = decode.register('kv', { size: 4096, remote: 'write' })
      const src = prefill.register('src', { size: 4096 })
      src.bytes.fill(0x42)
      const peer = await prefill.connect('decode-0', { timeoutMs: 10_000 })
      await until(() => peer.segments.has('kv'), 'the table')
      await prefill.write(peer, [{ local: [src, 0], remote: ['kv', 0], length: 4096 }], { timeoutMs: 10_000 })
      expect([...kv.bytes].every((b) => b === 0x42)).toBe(true)
      const first = peer.id
      await decode.close()
      decode = await TransferAgent.create({ host, transport: 'tcp', name: 'decode-0', metadata })
      kv = decode.register('kv', { size: 4096, remote: 'write' })
      src.bytes.fill(0x43)
      await until(() => prefill.members().get('decode-0')?.incarnation === decode.id, 'the new incarnation in the view', 10_000)
      await within(prefill.write(peer, [{ local: [src, 0], remote: ['kv', 0], length: 4096 }], { timeoutMs: 10_000 }), 15_000, 'the write to the restarted agent')
      expect([...kv.bytes].every((b) => b === 0x43)).toBe(true)
      expect(peer.id).not.toBe(first)
      expect(peer.id).toBe(decode.id)
    } finally {
      await prefill.close()
      await decode.close()
    }
  }, 60_000)
})
