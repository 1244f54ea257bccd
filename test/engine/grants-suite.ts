// Who may touch a segment (register's `peers`, grant(), revoke()), for any
// transport: test/rdma/109 runs it with 'rdma' (a memory window per peer's
// QP, enforced by the NIC), test/unit/100 with 'tcp' (the receiving agent's
// code). Each refusal is shown on the wire: a peer's table is forged back to
// the keys it held (or to the region's own key) and a WRITE is posted with
// them; it must fail with REM_ACCESS_ERR and leave the segment's bytes as
// they were, while the other peers go on. Semantics: docs/access.md, "Who may
// touch a segment".
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { PlainMemory, TransferAgent, type Peer, type Segment, type TransferAgentOptions } from '../../dist/index.js'
import { fill, until, within, type EngineEnv } from './util.js'

/** The internals a forged table reaches (as a peer that kept its old keys, or guessed one, would). */
type Forge = { link: { remote: { add(entries: unknown[], version: number, lanes: number): void; byName: Map<string, { laneKeys?: Uint32Array; region: { rkey: number } }> }; lanes: unknown[] } }

/** The keys `peer`'s table holds for `name`: one per lane (RDMA grants), else the segment's key on every lane. */
function keysOf(peer: Peer, name: string): number[] {
  const link = (peer as unknown as Forge).link
  const entry = link.remote.byName.get(name)
  if (!entry) throw new Error(`no entry '${name}' in the peer's table`)
  return entry.laneKeys ? [...entry.laneKeys] : link.lanes.map(() => entry.region.rkey)
}

/** Puts `name` back into `peer`'s table with `keys` (one per lane), as a peer that kept or guessed them would. */
function forge(peer: Peer, segment: Segment, keys: readonly number[]): void {
  const link = (peer as unknown as Forge).link
  const addr = '0x' + (segment.region as unknown as { address: number }).address.toString(16)
  link.remote.add([[segment.name, addr, keys[0], segment.length, 'read-write', [...keys]]], 1e9, link.lanes.length)
}

export function grantsTests(env: EngineEnv): void {
  const { host, transport } = env
  const agents: TransferAgent[] = []
  const create = async (name: string, options: Partial<TransferAgentOptions> = {}) => {
    const agent = await TransferAgent.create({ host, port: 0, transport, name, handshakeTimeoutMs: 20_000, ...options })
    agents.push(agent)
    return agent
  }
  let server: TransferAgent
  const lost: string[] = []
  beforeAll(async () => {
    server = await create('owner')
    server.on('peerLost', ({ peer }) => lost.push(peer.name))
  })
  afterAll(() => { for (const agent of agents) void agent.close() })

  const connect = async (client: TransferAgent) => client.connect({ host, port: server.port, timeoutMs: 20_000 })
  /** A write of `src` into `name` at `offset`: the result, or the error it failed with. */
  const write = (client: TransferAgent, peer: Peer, src: Segment, name: string, offset: number, length = src.length) =>
    within(client.write(peer, [{ local: [src, 0], remote: [name, offset], length }], { timeoutMs: 20_000 }).catch((e: unknown) => e), 30_000, `a write into '${name}'`)

  describe(`who may touch a segment: per-peer grants (${transport})`, () => {
    it('stats() says how grants are enforced', () => {
      expect(server.stats().grants).toBe(transport === 'rdma' ? 'windows' : 'software')
    })

    it('a segment granted to named peers: only they see it and write it; the region\'s own key opens nothing to the others', async () => {
      const seg = server.register('g-named', { size: 64 * 1024, remote: 'read-write', peers: ['alice'] })
      expect(seg.peers).toEqual(['alice'])
      const before = fill(seg, 1)
      const alice = await create('alice')
      const carol = await create('carol')
      const aPeer = await connect(alice)
      const cPeer = await connect(carol)
      await until(() => aPeer.segments.has('g-named'), 'alice to see the segment')
      expect(cPeer.segments.has('g-named'), 'carol is not granted it').toBe(false)
      const src = alice.register('g-named-src', { size: 16 * 1024 })
      const sent = fill(src, 2)
      expect(await write(alice, aPeer, src, 'g-named', 4096)).toMatchObject({ bytes: 16 * 1024 })
      before.set(sent, 4096)
      expect(Buffer.from(seg.bytes).equals(Buffer.from(before))).toBe(true)
      const cSrc = carol.register('g-named-carol', { size: 4096 })
      fill(cSrc, 3)
      expect(await write(carol, cPeer, cSrc, 'g-named', 0), 'carol names it').toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
      // Carol forges an entry with the region's own key (known or guessed): the device (TCP: the owner's code) refuses it.
      forge(cPeer, seg, keysOf(aPeer, 'g-named').map(() => seg.region instanceof PlainMemory ? seg.region.key : seg.region.describe().rkey))
      expect(await write(carol, cPeer, cSrc, 'g-named', 0), 'carol with the region\'s key').toMatchObject({ code: 'REM_ACCESS_ERR' })
      expect(Buffer.from(seg.bytes).equals(Buffer.from(before)), 'the segment is untouched').toBe(true)
      if (transport === 'rdma') {
        // A window of alice's link is valid on alice's QPs only: carol cannot use alice's keys either.
        const cPeer2 = await connect(carol)
        forge(cPeer2, seg, keysOf(aPeer, 'g-named'))
        expect(await write(carol, cPeer2, cSrc, 'g-named', 0), 'carol with alice\'s keys').toMatchObject({ code: 'REM_ACCESS_ERR' })
        expect(Buffer.from(seg.bytes).equals(Buffer.from(before)), 'the segment is untouched').toBe(true)
      }
      // Alice goes on.
      fill(src, 4)
      expect(await write(alice, aPeer, src, 'g-named', 0)).toMatchObject({ bytes: 16 * 1024 })
      expect(Buffer.from(seg.bytes.subarray(0, 16 * 1024)).equals(Buffer.from(src.bytes))).toBe(true)
      await server.unregister(seg, { timeoutMs: 20_000 })
    })

    it('revoke(peer, name): the revoked peer\'s keys are refused and the segment untouched, while another peer\'s transfer running at the same time completes', async () => {
      const SIZE = 8 * 1024 * 1024
      const seg = server.register('g-any', { size: 2 * SIZE, remote: 'read-write', peers: 'any' })
      seg.bytes.fill(0)
      const bob = await create('bob')
      const dan = await create('dan')
      const bPeer = await connect(bob)
      const dPeer = await connect(dan)
      await until(() => bPeer.segments.has('g-any') && dPeer.segments.has('g-any'), 'both to see the segment')
      const bSrc = bob.register('g-any-bob', { size: SIZE })
      const dSrc = dan.register('g-any-dan', { size: SIZE })
      fill(bSrc, 5)
      const danBytes = fill(dSrc, 6)
      expect(await write(bob, bPeer, bSrc, 'g-any', 0)).toMatchObject({ bytes: SIZE })
      const bobKeys = keysOf(bPeer, 'g-any')
      if (transport === 'rdma') expect(new Set([...bobKeys, ...keysOf(dPeer, 'g-any')]).size, 'a key of its own per peer and QP').toBe(2 * bobKeys.length)
      // Dan's 8 MiB goes in 64 KiB blocks while bob is revoked.
      const blocks = Array.from({ length: SIZE / 65536 }, (_, i) => ({ local: [dSrc, i * 65536] as [Segment, number], remote: ['g-any', SIZE + i * 65536] as [string, number], length: 65536 }))
      const danWrite = dan.write(dPeer, blocks, { timeoutMs: 60_000 })
      await server.revoke('bob', 'g-any')
      const snapshot = Buffer.from(seg.bytes.subarray(0, SIZE))
      await until(() => !bPeer.segments.has('g-any'), 'bob to hear of the revocation')
      expect(await write(bob, bPeer, bSrc, 'g-any', 0), 'bob names it after the revocation').toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
      fill(bSrc, 7)
      forge(bPeer, seg, bobKeys)
      expect(await write(bob, bPeer, bSrc, 'g-any', 0), 'bob with the keys he held').toMatchObject({ code: 'REM_ACCESS_ERR', bytesLanded: 0 })
      expect(Buffer.from(seg.bytes.subarray(0, SIZE)).equals(snapshot), 'bob\'s half is untouched since the revocation').toBe(true)
      expect(await within(danWrite, 60_000, 'dan\'s write')).toMatchObject({ bytes: SIZE })
      expect(Buffer.from(seg.bytes.subarray(SIZE)).equals(Buffer.from(danBytes)), 'dan\'s bytes all landed').toBe(true)
      expect(lost, 'dan\'s link never broke').not.toContain('dan')
      // Bob reconnects (his link broke on the refusal over RDMA): the segment stays out of his table.
      const bAgain = await connect(bob)
      expect(bAgain.segments.has('g-any'), 'not in the table of his new link').toBe(false)
      await server.unregister(seg, { timeoutMs: 20_000 })
    })

    it('grant() adds a peer, at once and to one that connects later; a revoked peer granted again sees it', async () => {
      const seg = server.register('g-later', { size: 4096, remote: 'read', peers: [] })
      const before = fill(seg, 8)
      const erin = await create('erin')
      const ePeer = await connect(erin)
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(ePeer.segments.has('g-later')).toBe(false)
      server.grant('erin', 'g-later')
      server.grant('frank', seg)
      expect(seg.peers).toEqual(['erin', 'frank'])
      await until(() => ePeer.segments.has('g-later'), 'erin to see the grant')
      const frank = await create('frank')
      const fPeer = await connect(frank)
      await until(() => fPeer.segments.has('g-later'), 'frank to see it at the handshake')
      const back = frank.register('g-later-back', { size: 4096 })
      expect(await within(frank.read(fPeer, [{ local: [back, 0], remote: ['g-later', 0], length: 4096 }], { timeoutMs: 20_000 }), 30_000, 'frank\'s read')).toMatchObject({ bytes: 4096 })
      expect(Buffer.from(back.bytes).equals(Buffer.from(before))).toBe(true)
      await until(() => [...server.peers.values()].some((p) => p.name === 'frank'), 'the owner to adopt frank\'s link')
      const frankHere = [...server.peers.values()].find((p) => p.name === 'frank')!
      await server.revoke(frankHere, 'g-later')
      await until(() => !fPeer.segments.has('g-later'), 'frank to hear of the revocation')
      server.grant('frank', 'g-later')
      await until(() => fPeer.segments.has('g-later'), 'frank to see it again')
      back.bytes.fill(0)
      expect(await within(frank.read(fPeer, [{ local: [back, 0], remote: ['g-later', 0], length: 4096 }], { timeoutMs: 20_000 }), 30_000, 'frank\'s read again')).toMatchObject({ bytes: 4096 })
      expect(Buffer.from(back.bytes).equals(Buffer.from(before))).toBe(true)
      await server.unregister(seg, { timeoutMs: 20_000 })
    })

    it('an unregister() whose wait ends early still revokes every grant at once: the keys a peer held are refused', async () => {
      // The caller's memory: its bytes stay readable after the region is deregistered.
      const memory = new Uint8Array(64 * 1024)
      const seg = server.register('g-gone', { memory, remote: 'write', peers: ['gina'] })
      const before = fill(seg, 9)
      const gina = await create('gina')
      const gPeer = await connect(gina)
      await until(() => gPeer.segments.has('g-gone'), 'gina to see the segment')
      const keys = keysOf(gPeer, 'g-gone')
      // A signal aborted already: the wait always ends before the peer's release arrives.
      await expect(server.unregister(seg, { signal: AbortSignal.abort() })).rejects.toMatchObject({ code: 'ABORT_ERR' })
      const src = gina.register('g-gone-src', { size: 4096 })
      fill(src, 10)
      forge(gPeer, seg, keys)
      expect(await write(gina, gPeer, src, 'g-gone', 0), 'gina with the keys she held').toMatchObject({ code: 'REM_ACCESS_ERR' })
      expect(Buffer.from(memory).equals(Buffer.from(before)), 'the withdrawn segment is untouched').toBe(true)
    })

    it('bad input: coded errors, nothing registered or changed', async () => {
      expect(() => server.register('g-bad', { size: 4096, remote: 'write', peers: 'all' as never })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
      expect(() => server.register('g-bad', { size: 4096, remote: 'write', peers: ['ok', ''] })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
      expect(() => server.register('g-bad', { size: 4096, remote: 'write', peers: [7] as never })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
      expect(server.segments.has('g-bad')).toBe(false)
      const shared = server.register('g-shared', { size: 4096, remote: 'write' })
      expect(shared.peers).toBe('shared')
      await expect(server.revoke('x', 'g-shared')).rejects.toMatchObject({ code: 'ERR_SEGMENT_SHARED' })
      expect(() => server.grant('x', shared)).toThrow(expect.objectContaining({ code: 'ERR_SEGMENT_SHARED' }))
      await expect(server.revoke('x', 'g-nothing')).rejects.toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
      const own = server.register('g-own', { size: 4096, remote: 'write', peers: 'any' })
      await expect(server.revoke(42 as never, own)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      expect(() => server.grant('', own)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
      await server.unregister(shared)
      await server.unregister(own)
    })
  })
}
