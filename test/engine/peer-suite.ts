// The engine against an agent in its own process (fixtures/transfer-peer.mjs),
// for any transport: test/rdma/101 and 104 run these with 'rdma', test/unit/93
// with 'tcp'. A peer killed mid-transfer: coded rejections within the bound,
// fail-fast while it is gone, a fresh link once it is back. Bounds by
// progress: a transfer whose completions keep coming is not failed by a stall
// bound shorter than it; a frozen peer fails it with ERR_STALLED within that
// bound; a read cut by a kill reports exactly the blocks confirmed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { TransferAgent, TransferError, type Block, type Peer } from '../../dist/index.js'
import { startChild, type Child } from './child-peer.js'
import { checksum, pattern, within, type EngineEnv } from './util.js'

const MiB = 1 << 20

export function peerDeathTests(env: EngineEnv): void {
  const { host, transport } = env
  const SIZE = 8 * MiB
  let agent: TransferAgent
  let child: Child | undefined

  beforeAll(async () => {
    agent = await TransferAgent.create({ host, port: 0, name: 'parent', qpsPerPeer: 2, transport })
  })
  afterAll(async () => {
    await child?.stop()
    agent?.close()
  })

  describe(`a peer process killed mid-transfer (${transport})`, () => {
    it('rejects within the bound with bytes landed, fails fast while the peer is gone, and succeeds on fresh QPs (a fresh socket) after a restart', async () => {
      child = await startChild(env, { size: SIZE })
      const port = child.port
      const src = agent.register('src', { size: SIZE })
      src.bytes.set(pattern(SIZE, 5))
      const peer = await agent.connect({ host, port, timeoutMs: 20_000 })
      // 4 KiB blocks, shuffled over the peer's segment: many work requests in flight.
      const blocks: Block[] = Array.from({ length: SIZE / 4096 }, (_, i) => ({ local: [src, i * 4096], remote: ['kv', ((i * 4099) % (SIZE / 4096)) * 4096], length: 4096 }))
      await within(agent.write(peer, blocks.slice(0, 256), { timeoutMs: 30_000 }), 35_000, 'a first write')
      const linkBefore = (peer as unknown as { link: { qps?: Array<{ qpn: number }> } }).link
      const qpnsBefore = linkBefore.qps?.map((qp) => qp.qpn) ?? []

      // Keep writing; kill the child once the first of these transfers has been posted.
      const TIMEOUT = 20_000
      // RDMA: 200 ms after they start; TCP on loopback may finish all four by then: at the first batch confirmed.
      let killed: () => void = () => undefined
      const firstBatch = new Promise<void>((resolve) => { killed = resolve })
      const onProgress = transport === 'tcp' ? () => killed() : undefined
      const transfers = Array.from({ length: 4 }, () => agent.write(peer, blocks, { timeoutMs: TIMEOUT, ...(onProgress ? { onProgress } : {}) }).then(() => 'done', (e) => e))
      await (transport === 'tcp' ? firstBatch : new Promise((resolve) => setTimeout(resolve, 200)))
      child.process.kill('SIGKILL')
      // Each transfer settles by its own bound (TIMEOUT) at the latest; this only guards against a hang.
      const outcomes = await within(Promise.all(transfers), TIMEOUT + 60_000, 'the transfers to settle after the kill')
      const failures = outcomes.filter((o): o is TransferError => o instanceof TransferError)
      expect(failures.length, `outcomes: ${outcomes.map((o) => (o as Error).message ?? o).join('; ')}`).toBeGreaterThan(0)
      for (const failure of failures) {
        expect(['ECONNRESET', 'WR_FLUSH_ERR', 'RETRY_EXC_ERR', 'ERR_CLOSED', 'ETIMEDOUT', 'ERR_QP_STATE']).toContain(failure.code)
        // What landed, said three ways that must agree: the bitmap's bits, the count, the bytes (4 KiB
        // blocks). Not all of them: the peer died first. (Which batches landed is not visible from here:
        // every block is one slice, so any count is whole slices; unit/91 checks the crediting.)
        const bits = [...failure.landedBlocks].reduce((n, byte) => n + popcount(byte), 0)
        expect({ bits, bytes: failure.bytesLanded, bitmapBytes: failure.landedBlocks.length })
          .toEqual({ bits: failure.blocksLanded, bytes: failure.blocksLanded * 4096, bitmapBytes: SIZE / 4096 / 8 })
        expect(failure.blocksLanded).toBeLessThan(SIZE / 4096)
      }
      await within(new Promise((resolve) => child!.process.exitCode !== null || child!.process.signalCode !== null ? resolve(0) : child!.process.once('exit', resolve)), 10_000, 'the child to exit')

      // Gone: the next transfer tries to reconnect and fails fast (no listener there).
      const gone = await within(agent.write(peer, blocks.slice(0, 4), { timeoutMs: 15_000 }).catch((e) => e), 20_000, 'a write to the dead peer')
      expect(gone).toBeInstanceOf(Error)
      expect(typeof gone.code).toBe('string')
      expect(peer.state).toBe('broken')

      // Back (same port): the next transfer reconnects with fresh QPs and its bytes land.
      child = await startChild(env, { port, size: SIZE })
      const result = await within(agent.write(peer, blocks, { timeoutMs: 60_000 }), 65_000, 'the write after the restart')
      expect(result.bytes).toBe(SIZE)
      expect(peer.state).toBe('connected')
      const linkAfter = (peer as unknown as { link: { qps?: Array<{ qpn: number }> } }).link
      expect(linkAfter, 'a new link').not.toBe(linkBefore)
      if (transport === 'rdma') expect(linkAfter.qps!.some((qp) => qpnsBefore.includes(qp.qpn)), 'no QP of the dead link reused').toBe(false)
      expect(agent.stats().peers[peer.id]!.reconnects).toBeGreaterThanOrEqual(1)
      // Checked on the far side: a sample of blocks, by checksum in the child.
      for (const i of [0, 1, 1000, SIZE / 4096 - 1]) {
        const remoteAt = ((i * 4099) % (SIZE / 4096)) * 4096
        expect(await child.sum(remoteAt, 4096), `block ${i}`).toBe(checksum(src.bytes.subarray(i * 4096, i * 4096 + 4096)))
      }
      await child.stop()
      child = undefined
    }, 180_000)
  })
}

const isLanded = (bitmap: Uint8Array, i: number): boolean => ((bitmap[i >> 3]! >> (i & 7)) & 1) === 1

/** What progressTests shares with the file that runs it (filled in beforeAll). */
export interface ProgressContext { agent: TransferAgent; peer: Peer; child: Child; expected: Uint8Array; size: number; block: number }

/** `before`: more tests of the caller's, run while the child is alive and before it is killed (they may replace ctx.peer). */
export function progressTests(env: EngineEnv, before?: (ctx: ProgressContext) => void): ProgressContext {
  const { host, transport } = env
  const SIZE = 64 * MiB
  const SEED = 11
  const BLOCK = 4096
  const expected = pattern(SIZE, SEED) // the child's segment
  const ctx = { expected, size: SIZE, block: BLOCK } as ProgressContext
  let agent: TransferAgent
  let child: Child | undefined
  let peer: Peer

  beforeAll(async () => {
    agent = ctx.agent = await TransferAgent.create({ host, port: 0, name: 'parent', qpsPerPeer: 2, transport })
    child = ctx.child = await startChild(env, { size: SIZE, seed: SEED })
    peer = ctx.peer = await agent.connect({ host, port: child.port, timeoutMs: 20_000 })
  }, 180_000)
  afterAll(async () => {
    await child?.stop()
    agent?.close()
  })

  describe(`bounds by progress (${transport})`, () => {
    it('bounds and progress listeners that are not what they must be are refused with a code, before anything is posted', async () => {
      const src = agent.register('bad', { size: BLOCK })
      src.bytes.set(expected.subarray(0, BLOCK)) // what the peer has there: the write that lands changes nothing
      const blocks: Block[] = [{ local: [src, 0], remote: ['kv', 0], length: BLOCK }]
      await expect(agent.write(peer, blocks, { stallTimeoutMs: 0 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
      await expect(agent.write(peer, blocks, { stallTimeoutMs: 'soon' as unknown as number })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      await expect(agent.write(peer, blocks, { onProgress: 42 as unknown as () => void })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      await expect(TransferAgent.create({ host, stallTimeoutMs: -1, transport })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
      await expect(TransferAgent.create({ host, transferTimeoutMs: 1.5, transport })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
      // A listener that throws fails its transfer with that error as the cause (no unhandled exception).
      const thrown = new Error('listener bug')
      const failed = await agent.write(peer, blocks, { onProgress: () => { throw thrown } }).catch((e: unknown) => e)
      expect(failed).toBeInstanceOf(TransferError)
      expect((failed as TransferError).cause).toBe(thrown)
      await agent.unregister(src)
    }, 60_000)

    it('a read whose completions keep coming is not failed by a stall bound shorter than the whole read', async () => {
      const STALL = 800
      // The peer's segment twice over (128 MiB), so that the read outlasts its stall bound several times.
      const dst = agent.register('whole', { size: 2 * SIZE })
      const progress: number[] = []
      const CHUNK = 64 << 10
      const blocks: Block[] = Array.from({ length: (2 * SIZE) / CHUNK }, (_, i) => ({ local: [dst, i * CHUNK], remote: ['kv', (i * CHUNK) % SIZE], length: CHUNK }))
      // TCP on loopback moves 128 MiB faster than the bound: each batch's
      // progress then keeps the loop busy for 15 ms (128 batches: ~2 s), a
      // transfer that progresses steadily, slower than its stall bound overall.
      const pace = transport === 'tcp' ? 15 : 0
      const onProgress = (bytes: number) => {
        progress.push(bytes)
        const until = performance.now() + pace
        while (performance.now() < until) { /* a slow consumer */ }
      }
      const result = await within(agent.read(peer, blocks, { stallTimeoutMs: STALL, onProgress }), 120_000, 'the read')
      expect(result.bytes).toBe(2 * SIZE)
      // The premise: the read outlasted its stall bound (else this proves nothing).
      expect(result.ms, 'the read took longer than stallTimeoutMs').toBeGreaterThan(STALL)
      expect(Buffer.compare(dst.bytes.subarray(0, SIZE), expected), 'every byte read (first copy)').toBe(0)
      expect(Buffer.compare(dst.bytes.subarray(SIZE), expected), 'every byte read (second copy)').toBe(0)
      // Progress: bytes confirmed, rising, at most once per batch, ending at the whole.
      expect(progress.length).toBeGreaterThan(1)
      for (let i = 1; i < progress.length; i++) expect(progress[i]!).toBeGreaterThan(progress[i - 1]!)
      expect(progress.at(-1)).toBe(2 * SIZE)
      expect(progress.length).toBeLessThanOrEqual(result.workRequests)
      await agent.unregister(dst)
    }, 180_000)

    it('a peer that stops answering fails the transfer with ERR_STALLED within stallTimeoutMs + 1 s, with what landed', async () => {
      const STALL = 1500
      const src = agent.register('src16', { size: 16 * BLOCK })
      src.bytes.set(pattern(16 * BLOCK, 3))
      // Into the segment's last 64 KiB, every other block (no coalescing): 16 blocks.
      const at = (i: number): number => SIZE - 32 * BLOCK + i * 2 * BLOCK
      const blocks: Block[] = Array.from({ length: 16 }, (_, i) => ({ local: [src, i * BLOCK], remote: ['kv', at(i)], length: BLOCK }))
      // Frozen. RDMA: its device still answers, but its process posts no more
      // receives: once the data QPs' notice receives are used up, a
      // notification is NAKed (RNR) and retried forever. TCP: its kernel takes
      // the bytes, but its agent acknowledges nothing. No completion comes.
      child!.process.kill('SIGSTOP')
      let stalled: TransferError | undefined
      let elapsed = 0
      for (let i = 0; i < 64 && !stalled; i++) {
        const started = performance.now()
        const outcome = await within(agent.write(peer, blocks, { notify: `n${i}`, stallTimeoutMs: STALL, timeoutMs: 30_000 }).then(() => undefined, (e: unknown) => e), 40_000, 'a notified write to a frozen peer')
        elapsed = performance.now() - started
        if (outcome !== undefined) {
          expect(outcome).toBeInstanceOf(TransferError)
          stalled = outcome as TransferError
        }
      }
      try { // the peer runs again whatever these find (a frozen peer would fail the tests after this one)
        expect(stalled, 'a notified write stalled once the frozen peer\'s receives were used up').toBeDefined()
        expect(stalled!.code).toBe('ERR_STALLED')
        expect(elapsed, 'failed within stallTimeoutMs + 1 s').toBeLessThanOrEqual(STALL + 1000)
        expect(stalled!.landedBlocks).toBeInstanceOf(Uint8Array)
        expect(stalled!.landedBlocks.length).toBe(2)
        if (transport === 'rdma') {
          // The notification rides on each QP's last batch, as the signaled
          // request: those batches are not confirmed while the frozen peer takes
          // no notice, so fewer blocks may be reported than its device placed,
          // never more (checked at the peer below).
          expect(stalled!.bytesLanded).toBe(stalled!.blocksLanded * BLOCK)
          expect(stalled!.blocksLanded).toBeLessThan(16)
        } else {
          // Nothing acknowledged the data: none is reported landed (it lands when the peer resumes).
          expect(stalled!.blocksLanded).toBe(0)
          expect(stalled!.bytesLanded).toBe(0)
        }
      } finally {
        child!.process.kill('SIGCONT')
      }
      // TCP: the frozen peer places the bytes once it runs again; a write acknowledged after them says it has.
      if (transport === 'tcp') await within(agent.write(peer, blocks.slice(0, 1), { timeoutMs: 30_000 }), 35_000, 'a write after the peer resumed')
      for (let i = 0; i < 16; i++) expect(await child!.sum(at(i), BLOCK), `block ${i} at the peer`).toBe(checksum(src.bytes.subarray(i * BLOCK, (i + 1) * BLOCK)))
      await agent.unregister(src)
    }, 240_000)
  })

  before?.(ctx)

  describe(`landed blocks after the peer is killed (${transport})`, () => {
    it(`a read cut by a kill (${transport}) reports the blocks completions confirmed, each one byte-correct here, and their bytes as bytesLanded`, async () => {
      peer = ctx.peer
      const COUNT = 8192 // 32 MiB of 4 KiB blocks, shuffled: one slice each, many batches in flight
      const dst = agent.register('cut', { size: COUNT * BLOCK })
      const remoteAt = (i: number): number => ((i * 4099) % COUNT) * BLOCK
      const blocks: Block[] = Array.from({ length: COUNT }, (_, i) => ({ local: [dst, i * BLOCK], remote: ['kv', remoteAt(i)], length: BLOCK }))
      const kill = (): void => { if (child!.process.signalCode === null) child!.process.kill('SIGKILL') }
      // Killed once the first batch is confirmed (or after 300 ms, whichever comes first).
      const timer = setTimeout(kill, 300)
      const outcome = await within(agent.read(peer, blocks, { onProgress: kill, timeoutMs: 60_000 }).then(() => 'done', (e: unknown) => e), 90_000, 'the read to settle after the kill')
      clearTimeout(timer)
      expect(outcome).toBeInstanceOf(TransferError)
      const error = outcome as TransferError
      expect(error.landedBlocks).toBeInstanceOf(Uint8Array)
      expect(error.landedBlocks.length).toBe(COUNT / 8)
      let landed = 0
      for (let i = 0; i < COUNT; i++) {
        if (!isLanded(error.landedBlocks, i)) continue
        landed++
        const at = remoteAt(i)
        if (Buffer.compare(dst.bytes.subarray(i * BLOCK, (i + 1) * BLOCK), expected.subarray(at, at + BLOCK)) !== 0) {
          expect.fail(`block ${i} is reported landed but its bytes are not the peer's`)
        }
      }
      expect(landed, `${error.code}: some blocks landed before the kill`).toBeGreaterThan(0)
      expect(landed).toBeLessThan(COUNT)
      expect(error.bytesLanded, 'bytesLanded is the reported blocks\' bytes').toBe(landed * BLOCK)
      expect(error.blocksLanded).toBe(landed)
      await agent.unregister(dst)
    }, 180_000)
  })
  return ctx
}

function popcount(byte: number): number {
  let n = 0
  for (let b = byte; b !== 0; b >>= 1) n += b & 1
  return n
}
