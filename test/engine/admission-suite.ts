// Who may connect (agent options.admission), for any transport: test/rdma/106
// runs it with 'rdma', test/unit/99 with 'tcp'. A peer with the shared secret
// is admitted and moves bytes; a wrong secret, a missing one on either side,
// a name not in the allow-list: ERR_PEER_REFUSED on the connecting side within
// the handshake bound, a coded handshakeError on the listening side, no peer
// on either, and the listening agent goes on serving. A hand-made client that
// sends a forged proof never receives the segment table. What is checked, and
// on the wire: docs/access.md, "Who may connect".
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { randomBytes } from 'node:crypto'
import { TransferAgent, type TransferAgentOptions } from '../../dist/index.js'
import { ControlInbox, type ControlChannel } from '../../dist/transfer/control.js'
import { fill, until, within, type EngineEnv } from './util.js'

/** A control channel opened by hand to the agent at `port`, and the hello its transport's agent would send (without admission fields). */
export interface RawDial { channel: ControlChannel; hello: Record<string, unknown>; close(): void }

const SECRET = 'a shared secret of the cluster, 32+'

export function admissionTests(env: EngineEnv, dialRaw: (port: number) => Promise<RawDial>): void {
  const { host, transport } = env
  const agents: TransferAgent[] = []
  const create = async (options: Omit<TransferAgentOptions, 'host' | 'transport'>) => {
    const agent = await TransferAgent.create({ host, port: 0, transport, handshakeTimeoutMs: 20_000, ...options })
    agents.push(agent)
    return agent
  }
  let server: TransferAgent
  const errors: Error[] = []
  const peersSeen: string[] = []
  beforeAll(async () => {
    server = await create({ name: 'gate', admission: { secret: SECRET, allow: ['good', 'good-2', 'wrong-secret', 'no-secret', 'forger'] } })
    server.on('handshakeError', (error) => errors.push(error))
    server.on('peer', (peer) => peersSeen.push(peer.name))
  })
  afterAll(() => { for (const agent of agents) agent.close() })

  /** The next handshakeError of the server after `before` of them. */
  const nextError = async (before: number) => {
    await until(() => errors.length > before, 'the listening side\'s handshakeError')
    return errors[before]!
  }

  /** Connects `client` to the server: the error it rejects with (within the bound), and the server's handshakeError. */
  const refusal = async (client: TransferAgent, port = server.port) => {
    const before = errors.length
    const error = await within(client.connect({ host, port, timeoutMs: 10_000 }).catch((e: unknown) => e), 15_000, 'the refused connect')
    return { error: error as Error & { code?: string }, before }
  }
  /** `client` is refused by the server (ERR_PEER_REFUSED on both sides, the reason in its message), and never became its peer. */
  const refusedByServer = async (client: TransferAgent, name: string, why: RegExp) => {
    const { error, before } = await refusal(client)
    expect(error).toMatchObject({ code: 'ERR_PEER_REFUSED' })
    expect(error.message).toMatch(why)
    expect(client.peers.size).toBe(0)
    expect(await nextError(before)).toMatchObject({ code: 'ERR_PEER_REFUSED' })
    expect(peersSeen).not.toContain(name)
    return error
  }

  describe(`who may connect: admission (${transport})`, () => {
    it('a peer with the secret is admitted both ways and moves bytes (write and read, every byte checked)', async () => {
      const client = await create({ name: 'good', admission: { secret: Buffer.from(SECRET) } })
      const target = server.register('adm-target', { size: 64 * 1024, remote: 'read-write' })
      const src = client.register('adm-src', { size: 64 * 1024 })
      const back = client.register('adm-back', { size: 64 * 1024 })
      const sent = fill(src, 11)
      const peer = await client.connect({ host, port: server.port, timeoutMs: 10_000 })
      expect(peer.name).toBe('gate')
      await until(() => peer.segments.has('adm-target'), 'the client to see the segment')
      await client.write(peer, [{ local: [src, 0], remote: ['adm-target', 0], length: 64 * 1024 }], { timeoutMs: 10_000 })
      expect(Buffer.from(target.bytes).equals(Buffer.from(sent))).toBe(true)
      const there = fill(target, 12)
      await client.read(peer, [{ local: [back, 0], remote: ['adm-target', 0], length: 64 * 1024 }], { timeoutMs: 10_000 })
      expect(Buffer.from(back.bytes).equals(Buffer.from(there))).toBe(true)
      await until(() => peersSeen.includes('good'), 'the server to see the peer')
      client.close()
      await server.unregister(target)
    })

    it('a wrong secret: ERR_PEER_REFUSED on the connecting side, no table, no peer; the server records ERR_PEER_REFUSED and goes on serving', async () => {
      server.register('adm-secret-seg', { size: 4096, remote: 'read' })
      const client = await create({ name: 'wrong-secret', admission: { secret: 'not the secret of the cluster, 32+' } })
      const { error, before } = await refusal(client)
      expect(error).toMatchObject({ code: 'ERR_PEER_REFUSED' })
      expect(client.peers.size).toBe(0)
      expect(await nextError(before)).toMatchObject({ code: 'ERR_PEER_REFUSED' })
      expect(peersSeen).not.toContain('wrong-secret')
      expect(JSON.stringify(error.message)).not.toContain(SECRET)
      // Still serving: a peer with the secret connects and sees the table.
      const good = await create({ name: 'good-2', admission: { secret: SECRET } })
      const peer = await good.connect({ host, port: server.port, timeoutMs: 10_000 })
      await until(() => peer.segments.has('adm-secret-seg'), 'the admitted peer to see the table')
      good.close()
      await server.unregister('adm-secret-seg')
    })

    it('a client without a secret, to a server that has one: ERR_PEER_REFUSED on both sides', async () => {
      await refusedByServer(await create({ name: 'no-secret' }), 'no-secret', /secret/)
    })

    it('a client with a secret, to a server without one: the client refuses it (ERR_PEER_REFUSED) and sends it no table', async () => {
      const open = await create({ name: 'open' })
      const openErrors: Error[] = []
      const openPeers: string[] = []
      open.on('handshakeError', (error) => openErrors.push(error))
      open.on('peer', (peer) => openPeers.push(peer.name))
      const client = await create({ name: 'careful', admission: { secret: SECRET } })
      client.register('careful-seg', { size: 4096, remote: 'read' })
      const error = await within(client.connect({ host, port: open.port, timeoutMs: 10_000 }).catch((e: unknown) => e), 15_000, 'the refused connect')
      expect(error).toMatchObject({ code: 'ERR_PEER_REFUSED' })
      expect(client.peers.size).toBe(0)
      await until(() => openErrors.length > 0, 'the open server\'s handshakeError')
      expect(openErrors[0]).toMatchObject({ code: 'ERR_PEER_REFUSED' })
      expect(openPeers).toEqual([])
    })

    it('a name not in the allow-list is refused, with the right secret too; a listed name is admitted', async () => {
      await refusedByServer(await create({ name: 'stranger', admission: { secret: SECRET } }), 'stranger', /allow/)
    })

    it('allow without a secret: the claimed name is checked', async () => {
      const named = await create({ name: 'named', admission: { allow: ['friend'] } })
      const namedErrors: Error[] = []
      named.on('handshakeError', (error) => namedErrors.push(error))
      const foe = await create({ name: 'foe' })
      const error = await within(foe.connect({ host, port: named.port, timeoutMs: 10_000 }).catch((e: unknown) => e), 15_000, 'the refused connect')
      expect(error).toMatchObject({ code: 'ERR_PEER_REFUSED' })
      await until(() => namedErrors.length > 0, 'the handshakeError')
      expect(namedErrors[0]).toMatchObject({ code: 'ERR_PEER_REFUSED' })
      const target = named.register('named-seg', { size: 4096, remote: 'write' })
      const friend = await create({ name: 'friend' })
      const src = friend.register('src', { size: 4096 })
      const sent = fill(src, 3)
      const peer = await friend.connect({ host, port: named.port, timeoutMs: 10_000 })
      await until(() => peer.segments.has('named-seg'), 'the friend to see the segment')
      await friend.write(peer, [{ local: [src, 0], remote: ['named-seg', 0], length: 4096 }], { timeoutMs: 10_000 })
      expect(Buffer.from(target.bytes).equals(Buffer.from(sent))).toBe(true)
    })

    it('a hand-made client that skips the server\'s proof and forges its own never receives the segment table', async () => {
      server.register('adm-forged', { size: 4096, remote: 'read-write' })
      const before = errors.length
      const raw = await dialRaw(server.port)
      const seen: Array<{ t: string }> = []
      let failed = false
      const inbox = new ControlInbox(raw.channel)
      inbox.listen((message) => { seen.push(message as { t: string }) }, () => { failed = true })
      try {
        await raw.channel.sendJson({ ...raw.hello, agent: 'forger', name: 'forger', nonce: randomBytes(32).toString('base64') })
        await until(() => seen.length > 0 || failed, 'the welcome')
        await raw.channel.sendJson({ t: 'proof', proof: randomBytes(32).toString('base64') })
        // The server answers with its table (admitted) or a refusal and a close (refused).
        await until(() => failed || seen.some((m) => m.t === 'add' || m.t === 'refused'), 'the server\'s answer to the proof')
        expect(seen.map((m) => m.t)).not.toContain('add')
        expect(seen.map((m) => m.t)).toEqual(['welcome', 'refused'])
        expect(await nextError(before)).toMatchObject({ code: 'ERR_PEER_REFUSED' })
        await until(() => failed, 'the server to close the connection')
      } finally {
        raw.close()
        await server.unregister('adm-forged')
      }
    })
  })
}
