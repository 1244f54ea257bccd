// The transfer engine's behaviour, for any transport: test/rdma/100 runs it
// with 'rdma' on the device, test/unit/93 with 'tcp' on loopback (no device).
// Random segment layouts and blocks (fast-check), read and write over 1-4
// QPs (lanes), every byte checked on both sides; notifications after the
// data, in order; 200 concurrent transfers; rights checked locally;
// withdrawn segments; bounded failures; a batch refused alone.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import fc from 'fast-check'
import { TransferAgent, TransferError, type Block, type Peer, type Segment } from '../../dist/index.js'
import { fill, until, within, type EngineEnv } from './util.js'

const KiB = 1024
const MiB = 1024 * KiB

/** The agents the suite shares: a server, and clients with 1, 2, 3 and 4 QPs (lanes) per peer, each connected to it. */
export interface EngineAgents { server: TransferAgent; clients: Array<{ agent: TransferAgent; peer: Peer }> }

/** Creates the agents before the file's tests (closed after them); the object is filled in beforeAll. */
export function engineAgents(env: EngineEnv): EngineAgents {
  const { host, transport } = env
  const ctx = { clients: [] } as unknown as EngineAgents
  beforeAll(async () => {
    ctx.server = await TransferAgent.create({ host, port: 0, name: 'server', transport })
    for (let qps = 1; qps <= 4; qps++) {
      const agent = await TransferAgent.create({ host, port: 0, name: `client-${qps}`, qpsPerPeer: qps, sliceBytes: 64 * KiB, transport })
      ctx.clients.push({ agent, peer: await agent.connect({ host, port: ctx.server.port, timeoutMs: 20_000 }) })
    }
  })
  afterAll(() => {
    for (const { agent } of ctx.clients) agent.close()
    ctx.server?.close()
  })
  return ctx
}

let unique = 0

export function engineTests(env: EngineEnv, ctx: EngineAgents): void {
    const { host, transport } = env

  describe(`transfers between two agents (${transport})`, () => {
    it('both sides see each other, and say which transport they run on', async () => {
      const { server, clients } = ctx
      clients.forEach(({ agent, peer }) => {
        expect(peer.state).toBe('connected')
        expect(peer.name).toBe('server')
        expect(agent.stats().transport).toBe(transport)
        expect(agent.transport).toBe(transport)
      })
      expect(server.stats().transport).toBe(transport)
      expect(server.device === undefined).toBe(transport === 'tcp')
      await until(() => server.peers.size === 4, 'the server to see 4 peers')
      expect([...server.peers.values()].map((p) => p.name).sort()).toEqual(['client-1', 'client-2', 'client-3', 'client-4'])
    })

    it('property: random segments and blocks (1 B..1 MiB), read and write, 1-4 QPs: every byte lands, nothing else changes', async () => {
      const layout = fc.record({
        client: fc.integer({ min: 0, max: 3 }),
        op: fc.constantFrom('read' as const, 'write' as const),
        localSegments: fc.integer({ min: 1, max: 3 }),
        remoteSegments: fc.integer({ min: 1, max: 3 }),
        lengths: fc.array(fc.oneof(fc.integer({ min: 1, max: 4 * KiB }), fc.integer({ min: 1, max: MiB })), { minLength: 1, maxLength: 6 }),
        gaps: fc.array(fc.integer({ min: 0, max: 2 * KiB }), { minLength: 6, maxLength: 6 }),
        adjacent: fc.boolean(),
        seed: fc.integer({ min: 1, max: 1 << 30 }),
      })
      await fc.assert(fc.asyncProperty(layout, async (t) => {
        const { server, clients } = ctx
        const { agent, peer } = clients[t.client]!
        const run = unique++
        // Place the blocks one after the other (with gaps unless adjacent) in segments picked round robin.
        const localEnds = new Array<number>(t.localSegments).fill(0)
        const remoteEnds = new Array<number>(t.remoteSegments).fill(0)
        const placed = t.lengths.map((length, i) => {
          const gap = t.adjacent ? 0 : t.gaps[i]!
          const ls = i % t.localSegments
          const rs = (i * 7 + 1) % t.remoteSegments
          const block = { ls, loff: localEnds[ls]! + gap, rs, roff: remoteEnds[rs]! + gap, length }
          localEnds[ls] = block.loff + length
          remoteEnds[rs] = block.roff + length
          return block
        })
        const locals = localEnds.map((end, i) => agent.register(`p${run}-l${i}`, { size: end + 1 + (t.seed % 512) }))
        const remotes = remoteEnds.map((end, i) => server.register(`p${run}-r${i}`, { size: end + 1 + (t.seed % 97), remote: 'read-write' }))
        try {
          await until(() => remotes.every((s) => peer.segments.has(s.name)), 'the client to see the new segments')
          const localBefore = locals.map((s, i) => fill(s, t.seed + i))
          const remoteBefore = remotes.map((s, i) => fill(s, t.seed + 100 + i))
          const blocks: Block[] = placed.map((b) => ({ local: [locals[b.ls]!, b.loff], remote: [remotes[b.rs]!.name, b.roff], length: b.length }))
          // Shuffle: coalescing must not depend on the order given.
          blocks.reverse()
          const result = await within(agent[t.op](peer, blocks, { timeoutMs: 50_000 }), 55_000, `${t.op} of ${blocks.length} blocks`)
          const bytes = t.lengths.reduce((a, b) => a + b, 0)
          expect(result).toMatchObject({ bytes, blocks: blocks.length })
          expect(result.workRequests).toBeGreaterThanOrEqual(Math.ceil(bytes / (64 * KiB)))
          expect(result.qps).toBeLessThanOrEqual(t.client + 1)
          // The model: destination = before, with every block copied from the source.
          const [srcSegs, srcBefore, dstSegs, dstBefore] = t.op === 'write' ? [locals, localBefore, remotes, remoteBefore] : [remotes, remoteBefore, locals, localBefore]
          const expected = dstBefore.map((b) => b.slice())
          for (const b of placed) {
            const [sSeg, sOff, dSeg, dOff] = t.op === 'write' ? [b.ls, b.loff, b.rs, b.roff] : [b.rs, b.roff, b.ls, b.loff]
            expected[dSeg]!.set(srcBefore[sSeg]!.subarray(sOff, sOff + b.length), dOff)
          }
          srcSegs.forEach((s, i) => expect(Buffer.compare(s.bytes, srcBefore[i]!), `source segment ${i} unchanged`).toBe(0))
          dstSegs.forEach((s, i) => expect(Buffer.compare(s.bytes, expected[i]!), `destination segment ${i}`).toBe(0))
        } finally {
          await Promise.all([...locals.map((s) => agent.unregister(s, { timeoutMs: 10_000 })), ...remotes.map((s) => server.unregister(s, { timeoutMs: 10_000 }))])
        }
      }), { numRuns: 12, seed: Number(process.env.FC_SEED ?? Date.now() % 100_000), verbose: true })
    }, 120_000)

    it('typed arrays of offsets with one block size move the same bytes as block objects; prepare() checks once and runs many times', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[3]!
      const src = agent.register('typed-src', { size: MiB })
      const dst = server.register('typed-dst', { size: MiB, remote: 'read-write' })
      await until(() => peer.segments.has('typed-dst'), 'the client to see typed-dst')
      const n = 256
      const localOffsets = new Float64Array(n)
      const remoteOffsets = new Float64Array(n)
      for (let i = 0; i < n; i++) { localOffsets[i] = i * 4096; remoteOffsets[i] = ((i * 389) % n) * 4096 } // a permutation
      const plan = agent.prepare(peer, 'write', { local: src, remote: 'typed-dst', localOffsets, remoteOffsets, blockSize: 4096 })
      expect(plan.bytes).toBe(MiB)
      for (let round = 0; round < 2; round++) {
        const data = fill(src, 500 + round)
        const result = await plan.run({ timeoutMs: 30_000 })
        expect(result).toMatchObject({ bytes: MiB, blocks: n, qps: 4 })
        const wrong: number[] = []
        for (let i = 0; i < n; i++) {
          if (Buffer.compare(dst.bytes.subarray(remoteOffsets[i]!, remoteOffsets[i]! + 4096), data.subarray(i * 4096, (i + 1) * 4096)) !== 0) wrong.push(i)
        }
        expect(wrong, `blocks with other bytes, round ${round}`).toEqual([])
      }
      await agent.unregister(src)
      await server.unregister(dst)
    })

    it('a notification arrives after its data is in place; 1000 notifications (concurrent transfers) arrive in call order, as events and through the iterator', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[1]!
      const src = agent.register('n-src', { size: 1000 * 64 })
      const dst = server.register('n-dst', { size: 1000 * 64, remote: 'write' })
      await until(() => peer.segments.has('n-dst'), 'the client to see n-dst')
      const data = fill(src, 9)
      dst.bytes.fill(0)
      const seen: number[] = []
      const misplaced: number[] = []
      const onNotification = ({ message, peer: from }: { message: string | Buffer; peer: Peer }) => {
        if (from.name !== 'client-2') return
        const i = Number(message)
        seen.push(i)
        // In the handler, this transfer's bytes are already there.
        if (Buffer.compare(dst.bytes.subarray(i * 64, i * 64 + 64), data.subarray(i * 64, i * 64 + 64)) !== 0) misplaced.push(i)
      }
      server.on('notification', onNotification)
      const iterator = server.notifications()
      const fromIterator = (async () => {
        const out: number[] = []
        for await (const n of iterator) {
          if (n.peer.name === 'client-2') out.push(Number(n.message))
          if (out.length === 1000) break
        }
        return out
      })()
      try {
        const results = await within(Promise.all(Array.from({ length: 1000 }, (_, i) =>
          agent.write(peer, [{ local: [src, i * 64], remote: ['n-dst', i * 64], length: 64 }], { notify: String(i), timeoutMs: 50_000 }))), 55_000, '1000 notified writes')
        expect(results.every((r) => r.bytes === 64)).toBe(true)
        await until(() => seen.length === 1000, '1000 notifications', 20_000)
        expect(misplaced).toEqual([])
        expect(seen).toEqual(Array.from({ length: 1000 }, (_, i) => i))
        expect(await within(fromIterator, 10_000, 'the iterator')).toEqual(seen)
        // Bytes as payload, and a notification alone.
        const bytes = new Promise<Buffer>((resolve) => server.once('notification', ({ message }) => resolve(message as Buffer)))
        await agent.notify(peer, new Uint8Array([1, 2, 3]))
        expect([...await within(bytes, 10_000, 'the bytes notification')]).toEqual([1, 2, 3])
        await expect(agent.notify(peer, 'x'.repeat(1025))).rejects.toSatisfy((e: unknown) => e instanceof RangeError && (e as { code?: string }).code === 'ERR_MESSAGE_TOO_LARGE')
        // 1 KiB of characters JSON escapes (6 bytes each) still fits.
        const escaped = new Promise<string | Buffer>((resolve) => server.once('notification', ({ message }) => resolve(message)))
        await agent.notify(peer, '\u0001'.repeat(1024))
        expect(await within(escaped, 10_000, 'the escaped notification')).toBe('\u0001'.repeat(1024))
        expect(agent.stats().total.notificationsSent).toBeGreaterThanOrEqual(1001)
      } finally {
        server.off('notification', onNotification)
      }
      await agent.unregister(src)
      await server.unregister(dst)
    }, 90_000)

    it('property: concurrent notified and plain transfers (writes and reads, 1-4 QPs, some aborted before they start): exactly the notifications of those that completed arrive, in call order, each write\'s data in place in the handler', async () => {
      const BLOCK = 4 * KiB
      const MAX_BLOCKS = 24
      const REGION = 2 * MAX_BLOCKS * BLOCK // a transfer's own region (blocks with gaps)
      const MAX_TRANSFERS = 10
      const transfer = fc.record({
        op: fc.constantFrom('read' as const, 'write' as const),
        notify: fc.boolean(),
        aborted: fc.integer({ min: 0, max: 7 }).map((n) => n === 0),
        blocks: fc.integer({ min: 1, max: MAX_BLOCKS }),
        gapEvery: fc.integer({ min: 1, max: 4 }),
      })
      const scenario = fc.record({ client: fc.integer({ min: 0, max: 3 }), transfers: fc.array(transfer, { minLength: 1, maxLength: MAX_TRANSFERS }), seed: fc.integer({ min: 1, max: 1 << 30 }) })
      const { server, clients } = ctx
      const dst = server.register('np-dst', { size: MAX_TRANSFERS * REGION, remote: 'read-write' })
      const srcs = clients.map(({ agent }) => agent.register('np-src', { size: MAX_TRANSFERS * REGION }))
      const seen: Array<{ from: string; message: string; inPlace: boolean }> = []
      let check: ((message: string) => boolean) | undefined
      const onNotification = ({ message, peer: from }: { message: string | Buffer; peer: Peer }) => {
        seen.push({ from: from.name, message: String(message), inPlace: check?.(String(message)) ?? false })
      }
      server.on('notification', onNotification)
      try {
        await until(() => clients.every(({ peer }) => peer.segments.has('np-dst')), 'the clients to see np-dst')
        let round = 0
        await fc.assert(fc.asyncProperty(scenario, async (t) => {
          const { agent, peer } = clients[t.client]!
          const src = srcs[t.client]!
          const tag = `np${round++}`
          const data = fill(src, t.seed)
          dst.bytes.fill(0)
          // Transfer i moves blocks of its own region: block k at 2k (or, every gapEvery-th, 2k + 1) block slots in.
          const layouts = t.transfers.map((x, i) => Array.from({ length: x.blocks }, (_, k) => i * REGION + (2 * k + (k % x.gapEvery === 0 ? 1 : 0)) * BLOCK))
          check = (message) => {
            const i = Number(message.split('-')[1])
            if (t.transfers[i]?.op !== 'write') return true
            return layouts[i]!.every((at) => Buffer.compare(dst.bytes.subarray(at, at + BLOCK), data.subarray(at, at + BLOCK)) === 0)
          }
          seen.length = 0
          const outcomes = await within(Promise.all(t.transfers.map((x, i) => {
            const blocks: Block[] = layouts[i]!.map((at) => ({ local: [src, at], remote: ['np-dst', at], length: BLOCK }))
            return agent[x.op](peer, blocks, { ...(x.notify ? { notify: `${tag}-${i}` } : {}), ...(x.aborted ? { signal: AbortSignal.abort() } : {}), timeoutMs: 30_000 })
              .then(() => 'done', (e: unknown) => (e as TransferError).code)
          })), 40_000, 'the transfers')
          expect(outcomes, 'aborted ones fail with ABORT_ERR, the others complete').toEqual(t.transfers.map((x) => x.aborted ? 'ABORT_ERR' : 'done'))
          const expected = t.transfers.flatMap((x, i) => x.notify && !x.aborted ? [`${tag}-${i}`] : [])
          // A notify() after them all: once it is here, every earlier notification is (they arrive in call order).
          await agent.notify(peer, `${tag}-end`)
          await until(() => seen.some((n) => n.message === `${tag}-end`), `the closing notification of ${tag}`, 20_000)
          const mine = seen.filter((n) => n.from === `client-${t.client + 1}` && n.message.startsWith(`${tag}-`))
          expect(mine.map((n) => n.message), 'exactly those of the transfers that completed, in call order, then the closing one').toEqual([...expected, `${tag}-end`])
          expect(mine.filter((n) => !n.inPlace).map((n) => n.message), 'writes whose data was not in place in the handler').toEqual([])
          // Reads brought the server's bytes (zeros) back into their blocks here.
          t.transfers.forEach((x, i) => {
            if (x.op === 'read' && !x.aborted) for (const at of layouts[i]!) expect(src.bytes.subarray(at, at + BLOCK).every((b) => b === 0), `read ${i} block at ${at}`).toBe(true)
          })
        }), { numRuns: 15, seed: Number(process.env.FC_SEED ?? Date.now() % 100_000), verbose: true })
      } finally {
        server.off('notification', onNotification)
        check = undefined
        await Promise.all(clients.map(({ agent }, i) => agent.unregister(srcs[i]!, { timeoutMs: 10_000 })))
        await server.unregister(dst, { timeoutMs: 10_000 })
      }
    }, 180_000)

    it('200 concurrent transfers (writes and reads, 4 blocks each) share the QPs and all complete with the right bytes', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[2]!
      const size = 200 * 4 * 4096
      const src = agent.register('c-src', { size })
      const back = agent.register('c-back', { size })
      const dst = server.register('c-dst', { size, remote: 'read-write' })
      await until(() => peer.segments.has('c-dst'), 'the client to see c-dst')
      const data = fill(src, 77)
      const before = agent.stats().peers[peer.id]!.transfers
      const blocksOf = (t: number, seg: Segment) => Array.from({ length: 4 }, (_, k) => ({ local: [seg, (t * 4 + k) * 4096] as const, remote: ['c-dst', (t * 4 + (3 - k)) * 4096] as const, length: 4096 }))
      await within(Promise.all(Array.from({ length: 200 }, (_, t) => agent.write(peer, blocksOf(t, src), { timeoutMs: 50_000 }))), 55_000, '200 writes')
      await within(Promise.all(Array.from({ length: 200 }, (_, t) => agent.read(peer, blocksOf(t, back), { timeoutMs: 50_000 }))), 55_000, '200 reads')
      expect(Buffer.compare(back.bytes, data)).toBe(0)
      const wrong: string[] = []
      for (let t = 0; t < 200; t++) for (let k = 0; k < 4; k++) {
        const at = (t * 4 + (3 - k)) * 4096
        if (Buffer.compare(dst.bytes.subarray(at, at + 4096), data.subarray((t * 4 + k) * 4096, (t * 4 + k + 1) * 4096)) !== 0) wrong.push(`${t}/${k}`)
      }
      expect(wrong, 'transfer/block with other bytes on the far side').toEqual([])
      const stats = agent.stats().peers[peer.id]!
      expect(stats.transfers - before).toBe(400)
      expect(stats.inFlight).toBe(0)
      expect(stats.p99Ms).toBeGreaterThanOrEqual(stats.p50Ms)
      await agent.unregister(src)
      await agent.unregister(back)
      await server.unregister(dst)
    }, 120_000)
  })

  describe(`rights, withdrawal and bounded failure (${transport})`, () => {
    it('rights are checked locally before posting: no write into a read-only segment, no read from a write-only one, nothing out of bounds', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[0]!
      const local = agent.register('r-local', { size: 8192 })
      const ro = server.register('r-ro', { size: 8192, remote: 'read' })
      const wo = server.register('r-wo', { size: 8192, remote: 'write' })
      await until(() => peer.segments.has('r-ro') && peer.segments.has('r-wo'), 'the client to see r-ro and r-wo')
      expect(peer.segments.get('r-ro')).toEqual({ name: 'r-ro', length: 8192, rights: 'read' })
      const before = agent.stats().peers[peer.id]!.workRequests
      ro.bytes.fill(5)
      const block = (remote: string, offset = 0, length = 4096): Block[] => [{ local: [local, 0], remote: [remote, offset], length }]
      await expect(agent.write(peer, block('r-ro'))).rejects.toMatchObject({ code: 'ERR_SEGMENT_RIGHTS' })
      await expect(agent.read(peer, block('r-wo'))).rejects.toMatchObject({ code: 'ERR_SEGMENT_RIGHTS' })
      await expect(agent.read(peer, block('r-ro', 8000))).rejects.toMatchObject({ code: 'ERR_BLOCK_RANGE' })
      await expect(agent.read(peer, block('nope'))).rejects.toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
      await expect(agent.read(peer, [{ local: ['r-local', 8000], remote: ['r-ro', 0], length: 4096 }])).rejects.toMatchObject({ code: 'ERR_BLOCK_RANGE' })
      expect(agent.stats().peers[peer.id]!.workRequests, 'nothing was posted').toBe(before)
      expect([...ro.bytes].every((b) => b === 5)).toBe(true)
      // Allowed directions work.
      await agent.read(peer, block('r-ro'))
      expect([...local.bytes.subarray(0, 4096)].every((b) => b === 5)).toBe(true)
      await agent.write(peer, block('r-wo'))
      await Promise.all([server.unregister(ro), server.unregister(wo), agent.unregister(local)])
    })

    it('memory that could not stay in place is refused the same way on either transport, and nothing is registered', async () => {
      const { server } = ctx
      const before = server.segments.size
      const resizable = new ArrayBuffer(4096, { maxByteLength: 8192 })
      const shared = new SharedArrayBuffer(4096)
      const detached = new ArrayBuffer(4096)
      structuredClone(detached, { transfer: [detached] })
      const refused: Array<[string, unknown, string]> = [
        ['a resizable ArrayBuffer', resizable, 'ERR_RESIZABLE'],
        ['a view over a resizable ArrayBuffer', new Uint8Array(resizable), 'ERR_RESIZABLE'],
        ['a growable SharedArrayBuffer', new SharedArrayBuffer(4096, { maxByteLength: 8192 }), 'ERR_RESIZABLE'],
        ['a SharedArrayBuffer', shared, 'ERR_INVALID_ARG_TYPE'],
        ['a view over a SharedArrayBuffer', new Uint8Array(shared), 'ERR_INVALID_ARG_TYPE'],
        ['a detached ArrayBuffer', detached, 'ERR_DETACHED'],
        ['an empty view', new Uint8Array(8).subarray(8), 'ERR_OUT_OF_RANGE'],
      ]
      for (const [what, memory, code] of refused) {
        // The types refuse a SharedArrayBuffer too: the run-time check is for JavaScript callers.
        expect(() => server.register(`refused-${unique++}`, { memory: memory as ArrayBuffer }), what).toThrow(expect.objectContaining({ code }))
      }
      expect(server.segments.size, 'no segment was added').toBe(before)
      resizable.resize(16) // still the caller's
    })

    it('unregistering a segment withdraws it from peers: new and prepared transfers naming it fail with a code', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[2]!
      const local = agent.register('w-local', { size: 4096 })
      const gone = server.register('w-gone', { size: 4096, remote: 'read-write' })
      await until(() => peer.segments.has('w-gone'), 'the client to see w-gone')
      const plan = agent.prepare(peer, 'write', [{ local: [local, 0], remote: ['w-gone', 0], length: 4096 }])
      await plan.run({ timeoutMs: 10_000 })
      await server.unregister(gone)
      expect(gone.withdrawn).toBe(true)
      await until(() => !peer.segments.has('w-gone'), 'the withdrawal to reach the client')
      await expect(plan.run()).rejects.toMatchObject({ code: 'ERR_SEGMENT_WITHDRAWN' })
      await expect(agent.write(peer, [{ local: [local, 0], remote: ['w-gone', 0], length: 4096 }])).rejects.toMatchObject({ code: 'ERR_SEGMENT_UNKNOWN' })
      // Locally too: a withdrawn local segment is refused.
      await agent.unregister(local)
      await expect(agent.write(peer, [{ local: [local, 0], remote: ['w-gone', 0], length: 4096 }])).rejects.toMatchObject({ code: 'ERR_SEGMENT_WITHDRAWN' })
      expect(peer.state).toBe('connected')
    })

    it('a prepared plan runs again after the peer re-registers a segment under the same name: it rechecks against the new table', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[2]!
      const local = agent.register('re-local', { size: 4096 })
      const first = server.register('re-seg', { size: 4096, remote: 'read-write' })
      await until(() => peer.segments.has('re-seg'), 'the client to see re-seg')
      const plan = agent.prepare(peer, 'write', [{ local: [local, 0], remote: ['re-seg', 0], length: 4096 }])
      await plan.run({ timeoutMs: 10_000 })
      await server.unregister(first)
      // Back under the same name, twice as long (so that this side sees the new entry, not the old one).
      const second = server.register('re-seg', { size: 8192, remote: 'read-write' })
      await until(() => peer.segments.get('re-seg')?.length === 8192, 'the client to see the new re-seg')
      const data = fill(local, 31)
      second.bytes.fill(0)
      await plan.run({ timeoutMs: 10_000 })
      expect(Buffer.compare(second.bytes.subarray(0, 4096), data), 'the plan wrote into the new segment').toBe(0)
      // Back too short for the plan: it fails as a fresh check would, before anything is posted.
      await server.unregister(second)
      const short = server.register('re-seg', { size: 2048, remote: 'read-write' })
      await until(() => peer.segments.get('re-seg')?.length === 2048, 'the client to see the short re-seg')
      await expect(plan.run({ timeoutMs: 10_000 })).rejects.toMatchObject({ code: 'ERR_BLOCK_RANGE' })
      expect(peer.state).toBe('connected')
      await Promise.all([server.unregister(short), agent.unregister(local)])
    })

    it('an aborted or timed-out transfer settles with a coded TransferError saying how many bytes landed', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[3]!
      const local = agent.register('a-local', { size: 8 * MiB })
      const remote = server.register('a-remote', { size: 8 * MiB, remote: 'read-write' })
      await until(() => peer.segments.has('a-remote'), 'the client to see a-remote')
      const blocks: Block[] = [{ local: [local, 0], remote: ['a-remote', 0], length: 8 * MiB }]
      const aborted = await agent.write(peer, blocks, { signal: AbortSignal.abort() }).catch((e) => e)
      expect(aborted).toBeInstanceOf(TransferError)
      expect(aborted).toMatchObject({ code: 'ABORT_ERR', bytesLanded: 0, bytes: 8 * MiB })
      const controller = new AbortController()
      const pending = agent.write(peer, blocks, { signal: controller.signal }).catch((e) => e)
      controller.abort()
      const late = await within(pending, 10_000, 'the aborted write')
      expect(late).toBeInstanceOf(TransferError)
      expect(late).toMatchObject({ code: 'ABORT_ERR', bytes: 8 * MiB })
      // One block: it landed whole or it counts nothing (a block partly landed counts 0), and the
      // count, the bytes and the bitmap say the same.
      expect({ bytes: late.bytesLanded, blocks: late.blocksLanded, bitmap: [...late.landedBlocks] })
        .toEqual(late.blocksLanded === 1 ? { bytes: 8 * MiB, blocks: 1, bitmap: [1] } : { bytes: 0, blocks: 0, bitmap: [0] })
      // A deadline fires only when the event loop turns. One 8 MiB block can complete inside its posts
      // and their microtasks (so a 1 ms deadline did not fire: the write resolved); 8192 blocks of 1 KiB
      // that do not coalesce take 512 batches, and the loop turns during them.
      const count = 8 * MiB / KiB
      const shuffled = { local, remote: 'a-remote', blockSize: KiB,
        localOffsets: Float64Array.from({ length: count }, (_, i) => (count - 1 - i) * KiB), remoteOffsets: Float64Array.from({ length: count }, (_, i) => i * KiB) }
      const timedOut = await within(agent.write(peer, shuffled, { timeoutMs: 1 }).catch((e) => e), 10_000, 'a 1 ms write of 8192 blocks')
      expect(timedOut).toBeInstanceOf(TransferError)
      expect(timedOut).toMatchObject({ code: 'ETIMEDOUT', bytes: 8 * MiB })
      const bits = [...(timedOut as TransferError).landedBlocks].reduce((n, byte) => n + popcount(byte), 0)
      expect({ bits, bytes: timedOut.bytesLanded, bitmapBytes: timedOut.landedBlocks.length })
        .toEqual({ bits: timedOut.blocksLanded, bytes: timedOut.blocksLanded * KiB, bitmapBytes: count / 8 })
      expect(timedOut.blocksLanded).toBeLessThan(count)
      // The link stays usable: abandoned batches drain, and the next transfer runs.
      expect(peer.state).toBe('connected')
      fill(local, 3)
      await agent.write(peer, blocks, { timeoutMs: 30_000 })
      expect(Buffer.compare(remote.bytes, local.bytes)).toBe(0)
      await agent.unregister(local, { timeoutMs: 10_000 })
      await server.unregister(remote, { timeoutMs: 10_000 })
    })

    it('the event loop turns during a large transfer: a timer set as it starts fires before it ends', async () => {
      // 4096 blocks of 1 KiB that do not coalesce (neighbours on the remote side
      // are far apart here): 256 batches. Soft-RoCE completes a batch inside its
      // post, and each completion posts the next batch from a microtask: unless
      // the completion queue yields every INLINE_BUDGET completions, the whole
      // transfer ran in one macrotask, and timers and I/O (another connection's
      // handshake) waited for its end.
      const { server, clients } = ctx
      const { agent, peer } = clients[0]!
      const count = 4096
      const local = agent.register('loop-local', { size: count * KiB })
      const remote = server.register('loop-remote', { size: count * KiB, remote: 'write' })
      await until(() => peer.segments.has('loop-remote'), 'the client to see loop-remote')
      fill(local, 11)
      const localOffsets = Float64Array.from({ length: count }, (_, i) => (count - 1 - i) * KiB)
      const remoteOffsets = Float64Array.from({ length: count }, (_, i) => i * KiB)
      let fired = false
      const write = agent.write(peer, { local, remote: 'loop-remote', localOffsets, remoteOffsets, blockSize: KiB }, { timeoutMs: 120_000 })
      setTimeout(() => { fired = true }, 0)
      const firedBeforeEnd = await write.then((result) => {
        expect(result.workRequests).toBe(count)
        return fired
      })
      expect(firedBeforeEnd).toBe(true)
      for (let i = 0; i < count; i += 511) {
        expect(Buffer.compare(remote.bytes.subarray(i * KiB, (i + 1) * KiB), local.bytes.subarray((count - 1 - i) * KiB, (count - i) * KiB))).toBe(0)
      }
      await agent.unregister(local, { timeoutMs: 10_000 })
      await server.unregister(remote, { timeoutMs: 10_000 })
    })

    it('transfers under way on one link share one stall timer: none arms its own, and none keeps the process alive once they settled', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[1]!
      const count = 16
      const local = agent.register('stall-local', { size: count * 4 * KiB })
      const remote = server.register('stall-remote', { size: count * 4 * KiB, remote: 'write' })
      await until(() => peer.segments.has('stall-remote'), 'the client to see stall-remote')
      fill(local, 5)
      const one = (i: number): Block[] => [{ local: [local, i * 4 * KiB], remote: ['stall-remote', i * 4 * KiB], length: 4 * KiB }]
      await agent.write(peer, one(0))
      // Timers that keep the process alive (an unref'd one is not listed).
      const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
      const before = timers()
      const writes = Array.from({ length: count }, (_, i) => agent.write(peer, one(i)))
      for (let i = 0; i < 20; i++) await Promise.resolve() // they start (a write may first wait for its link)
      const during = timers()
      await within(Promise.all(writes), 30_000, 'the writes')
      expect(during - before, 'timers armed by 16 writes under way').toBeLessThanOrEqual(1)
      expect(timers(), 'timers keeping the process alive once they settled').toBe(before)
      expect(Buffer.compare(remote.bytes, local.bytes)).toBe(0)
      await agent.unregister(local, { timeoutMs: 10_000 })
      await server.unregister(remote, { timeoutMs: 10_000 })
    })

    it('on a connected peer a transfer starts within its call (numbered then, its batch queued), and a failure of one is still resumable', async () => {
      const { server, clients } = ctx
      const { agent, peer } = clients[0]!
      const local = agent.register('now-local', { size: 8 * KiB })
      const remote = server.register('now-remote', { size: 8 * KiB, remote: 'read-write' })
      await until(() => peer.segments.has('now-remote'), 'the client to see now-remote')
      fill(local, 6)
      const inFlight = (): number => agent.stats().peers[peer.id]!.inFlight
      const write = agent.write(peer, [{ local: [local, 0], remote: ['now-remote', 0], length: 4 * KiB }])
      const read = agent.read(peer, [{ local: [local, 4 * KiB], remote: ['now-remote', 0], length: 4 * KiB }])
      expect(inFlight(), 'transfers under way as the calls return').toBe(2)
      await within(Promise.all([write, read]), 30_000, 'the write and the read')
      expect(Buffer.compare(local.bytes.subarray(4 * KiB), local.bytes.subarray(0, 4 * KiB))).toBe(0)
      // Aborted after it started: a TransferError that resume() takes (it sends the block again).
      const controller = new AbortController()
      const aborted = agent.write(peer, [{ local: [local, 0], remote: ['now-remote', 4 * KiB], length: 4 * KiB }], { signal: controller.signal })
      controller.abort()
      const failed = await aborted.catch((e: unknown) => e)
      expect(failed).toBeInstanceOf(TransferError)
      const resumed = await within(agent.resume(failed as TransferError), 30_000, 'the resume')
      expect(resumed.blocksSkipped + resumed.blocks).toBe(1)
      expect(Buffer.compare(remote.bytes.subarray(4 * KiB), local.bytes.subarray(0, 4 * KiB))).toBe(0)
      await agent.unregister(local, { timeoutMs: 10_000 })
      await server.unregister(remote, { timeoutMs: 10_000 })
    })

    it('a batch refused alone (its local segment unregistered during the transfer) fails its transfer, not the link', async () => {
      const { server } = ctx
      const agent = await TransferAgent.create({ host, port: 0, name: 'refused', qpsPerPeer: 1, transport })
      try {
        const peer = await agent.connect({ host, port: server.port, timeoutMs: 20_000 })
        const count = 4096
        const local = agent.register('refused-local', { size: count * KiB })
        const remote = server.register('refused-remote', { size: count * KiB, remote: 'write' })
        await until(() => peer.segments.has('refused-remote'), 'the client to see refused-remote')
        const localOffsets = Float64Array.from({ length: count }, (_, i) => (count - 1 - i) * KiB)
        const remoteOffsets = Float64Array.from({ length: count }, (_, i) => i * KiB)
        const link = (peer as unknown as { link: unknown }).link
        const failed = agent.write(peer, { local, remote: 'refused-remote', localOffsets, remoteOffsets, blockSize: KiB }, { timeoutMs: 120_000 }).catch((e) => e)
        // On the next turn of the loop: batches are posted and complete by then, and more wait.
        await new Promise((resolve) => setImmediate(resolve))
        const unregistered = agent.unregister(local, { timeoutMs: 30_000 })
        const error = await within(failed, 60_000, 'the write whose segment was unregistered')
        await unregistered
        expect(error).toBeInstanceOf(TransferError)
        expect(error).toMatchObject({ code: 'ERR_SEGMENT_WITHDRAWN', bytes: count * KiB })
        expect(error.bytesLanded).toBeLessThan(count * KiB)
        // The link is the same, healthy one: the next transfer runs on it, without reconnecting.
        expect(peer.state).toBe('connected')
        const again = agent.register('refused-again', { size: 4096 })
        fill(again, 12)
        await agent.write(peer, [{ local: [again, 0], remote: ['refused-remote', 0], length: 4096 }], { timeoutMs: 30_000 })
        expect(Buffer.compare(remote.bytes.subarray(0, 4096), again.bytes)).toBe(0)
        expect((peer as unknown as { link: unknown }).link).toBe(link)
        expect(agent.stats().peers[peer.id]!.reconnects).toBe(0)
        await server.unregister(remote, { timeoutMs: 10_000 })
      } finally {
        agent.close()
      }
    })

    it('a withdrawal racing posted batches fails only the transfer naming the segment: the device is done with its batches before the memory goes, the link and its other transfers carry on', async () => {
      const { server } = ctx
      const agent = await TransferAgent.create({ host, port: 0, name: 'race', qpsPerPeer: 1, transport })
      try {
        const peer = await agent.connect({ host, port: server.port, timeoutMs: 20_000 })
        const count = 8192
        const src = agent.register('race-src', { size: count * KiB })
        const going = server.register('race-going', { size: count * KiB, remote: 'write' })
        const staying = server.register('race-staying', { size: count * KiB, remote: 'write' })
        await until(() => peer.segments.has('race-going') && peer.segments.has('race-staying'), 'the client to see both')
        const data = fill(src, 51)
        const link = (peer as unknown as { link: unknown }).link
        // 1 KiB blocks that do not coalesce: 512 batches each, on one QP, taking turns.
        const shuffled = (remote: string) => ({ local: src, remote, blockSize: KiB,
          localOffsets: Float64Array.from({ length: count }, (_, i) => (count - 1 - i) * KiB), remoteOffsets: Float64Array.from({ length: count }, (_, i) => i * KiB) })
        let unregistered: Promise<void> | undefined
        // Withdrawn as soon as the first batch of the transfer naming it completed: more of its batches are in flight.
        const onProgress = () => { unregistered ??= server.unregister(going, { timeoutMs: 30_000 }) }
        const racing = agent.write(peer, shuffled('race-going'), { timeoutMs: 60_000, onProgress }).then(() => 'done', (e: unknown) => e)
        const other = agent.write(peer, shuffled('race-staying'), { timeoutMs: 60_000 }).catch((e: unknown) => e)
        const [raced, result] = await within(Promise.all([racing, other]), 90_000, 'the two writes')
        await within(unregistered!, 35_000, 'the unregister')
        // The premise: the withdrawal reached the client mid-transfer (it was sent after the first of 512 batches).
        // Then the transfer fails as withdrawn at its next batch, with what landed; never refused by the device.
        expect(raced, `the racing write: ${(raced as Error).message ?? raced}`).toMatchObject({ code: 'ERR_SEGMENT_WITHDRAWN' })
        expect((raced as TransferError).bytesLanded).toBeLessThan(count * KiB)
        expect(result, `the other write: ${(result as Error).message}`).toMatchObject({ bytes: count * KiB })
        for (let i = 0; i < count; i += 257) {
          expect(Buffer.compare(staying.bytes.subarray(i * KiB, (i + 1) * KiB), data.subarray((count - 1 - i) * KiB, (count - i) * KiB))).toBe(0)
        }
        expect(peer.state).toBe('connected')
        expect((peer as unknown as { link: unknown }).link, 'the same link').toBe(link)
        expect(agent.stats().peers[peer.id]!.reconnects).toBe(0)
        await server.unregister(staying, { timeoutMs: 10_000 })
      } finally {
        agent.close()
      }
    }, 120_000)
  })

  describe(`tables and reconnects (${transport})`, () => {
    it('segments registered while a peer connects reach it, however many and however long their names (the resync after the handshake goes in chunks)', async () => {
      const { server } = ctx
      const long = (i: number) => `resync-${String(i).padStart(4, '0')}-${'x'.repeat(100)}`
      const agent = await TransferAgent.create({ host, port: 0, name: 'resync', transport })
      try {
        // 30 before the connect: the handshake's table, in chunks. Then, as the handshake takes its snapshot of
        // the table (it describes each segment), 100 more right after it: those reach the server only through
        // the resync that follows the handshake.
        for (let i = 0; i < 30; i++) agent.register(long(i), { size: 4096 })
        const region = agent.segments.get(long(0))!.region as unknown as { describe(): unknown }
        const describe = region.describe.bind(region)
        let armed = true
        region.describe = () => {
          if (armed) {
            armed = false
            queueMicrotask(() => { for (let i = 30; i < 130; i++) agent.register(long(i), { size: 4096 }) })
          }
          return describe()
        }
        const peer = await agent.connect({ host, port: server.port, timeoutMs: 20_000 })
        const snapshot = (peer as unknown as { link: { sentTable: { entries: unknown[] } } }).link.sentTable.entries.length
        expect({ snapshot, now: agent.segments.size }, 'the premise: 100 segments came between the snapshot and the adoption').toEqual({ snapshot: 30, now: 130 })
        await until(() => [...server.peers.values()].some((p) => p.id === agent.id && p.segments.size === 130),
          'the server to see all 130 segments (100 of them registered after the handshake\'s snapshot)')
        const there = [...server.peers.values()].find((p) => p.id === agent.id)!
        expect([...there.segments.keys()].sort()).toEqual([...agent.segments.keys()].sort())
        expect(there.state).toBe('connected')
      } finally {
        agent.close()
      }
    }, 60_000)

    it('concurrent reconnects each keep their own bound: aborting one transfer does not fail another reconnecting to the same peer', async () => {
      const { server } = ctx
      const agent = await TransferAgent.create({ host, port: 0, name: 'relink', transport })
      const target = server.register('relink-target', { size: 8192, remote: 'write' })
      try {
        const peer = await agent.connect({ host, port: server.port, timeoutMs: 20_000 })
        const local = agent.register('relink-local', { size: 4096 })
        await until(() => peer.segments.has('relink-target') && [...server.peers.values()].some((p) => p.id === agent.id), 'both sides to see each other')
        // The server drops the link: the client's next transfers reconnect (it knows the address).
        server.closePeer([...server.peers.values()].find((p) => p.id === agent.id)!)
        await until(() => peer.state === 'broken', 'the client to see its link fail')
        const data = fill(local, 41)
        const controller = new AbortController()
        const aborted = agent.write(peer, [{ local: [local, 0], remote: ['relink-target', 0], length: 4096 }], { signal: controller.signal, timeoutMs: 20_000 }).catch((e) => e)
        const other = agent.write(peer, [{ local: [local, 0], remote: ['relink-target', 4096], length: 4096 }], { timeoutMs: 20_000 }).catch((e) => e)
        controller.abort()
        expect(await within(aborted, 25_000, 'the aborted write')).toMatchObject({ code: 'ABORT_ERR' })
        const result = await within(other, 25_000, 'the other write')
        expect(result, `the other write: ${(result as Error).message}`).toMatchObject({ bytes: 4096 })
        expect(Buffer.compare(target.bytes.subarray(4096), data)).toBe(0)
        expect(peer.state).toBe('connected')
        // A caller with a bound shorter than the reconnect fails alone too (ETIMEDOUT), the other one's write lands.
        await until(() => [...server.peers.values()].some((p) => p.id === agent.id && p.state === 'connected'), 'the server to see the new link')
        server.closePeer([...server.peers.values()].find((p) => p.id === agent.id)!)
        await until(() => peer.state === 'broken', 'the client to see its link fail again')
        const hasty = agent.write(peer, [{ local: [local, 0], remote: ['relink-target', 0], length: 4096 }], { timeoutMs: 1 }).catch((e) => e)
        const patient = agent.write(peer, [{ local: [local, 0], remote: ['relink-target', 4096], length: 4096 }], { timeoutMs: 20_000 }).catch((e) => e)
        const outcomes = await within(Promise.all([hasty, patient]), 25_000, 'the two writes')
        expect(outcomes[1], `the patient write: ${(outcomes[1] as Error).message}`).toMatchObject({ bytes: 4096 })
      } finally {
        agent.close()
        await server.unregister(target)
      }
    }, 60_000)
  })
}

function popcount(byte: number): number {
  let n = 0
  for (let b = byte; b !== 0; b >>= 1) n += b & 1
  return n
}
