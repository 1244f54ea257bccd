// agent.resume() against an agent in its own process (fixtures/transfer-peer.mjs),
// for any transport: test/rdma/101 runs these with 'rdma', test/unit/93 with
// 'tcp'. A large write cut by the peer's agent restarting on memory it keeps,
// resumed: every block right at the peer, the bytes resent within 1.1x of the
// bytes the peer was missing. A peer process killed and restarted (its memory
// fresh): what had landed is gone there, and resume sends every block again.
// A link dropped without a restart, twice: the second failure reports over
// the original blocks. And the coded refusals.
import { createHash } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { TransferAgent, TransferError, type Block, type BlockArrays, type Peer, type Segment } from '../../dist/index.js'
import { startChild, type Child } from './child-peer.js'
import { within, type EngineEnv } from './util.js'

const MiB = 1 << 20
/** The large write: 1 GiB (RESUME_MIB overrides; the guest's default 3 GiB holds 1 GiB on each side). */
const LARGE = Number(process.env.RESUME_MIB ?? 1024) * MiB

const md5 = (bytes: Uint8Array): string => createHash('md5').update(bytes).digest('hex').slice(0, 16)
/** Block i goes to position perm(i) of the peer's segment: a permutation (4099 is odd, counts are powers of two). */
const perm = (i: number, count: number): number => (i * 4099) % count

/** Distinct, incompressible-looking blocks: one random block, each copy stamped with its index. */
function fillBlocks(segment: Segment, block: number, count: number): string[] {
  const base = createHash('sha512')
  const seed = new Uint8Array(block)
  for (let o = 0; o < block; o += 64) seed.set(base.copy().update(String(o)).digest().subarray(0, Math.min(64, block - o)), o)
  const view = new DataView(segment.bytes.buffer, segment.bytes.byteOffset, segment.bytes.byteLength)
  const hashes: string[] = []
  for (let i = 0; i < count; i++) {
    segment.bytes.set(seed, i * block)
    view.setUint32(i * block, i + 1)
    view.setUint32(i * block + block - 4, i + 1)
    hashes.push(md5(segment.bytes.subarray(i * block, (i + 1) * block)))
  }
  return hashes
}

/** Which of the caller's blocks are right at the peer now (block i at perm(i)). */
async function rightAtPeer(child: Child, expected: string[], block: number): Promise<boolean[]> {
  const count = expected.length
  const there = await child.hashes(0, block, count)
  return expected.map((hash, i) => there[perm(i, count)] === hash)
}

/**
 * A progress listener that calls `cut` (which asks the child to restart or
 * drop its links) once `at` bytes are confirmed, then is a slow consumer (busy
 * 20 ms per batch), so that the child acts before the transfer ends (TCP on
 * loopback would otherwise finish it first).
 */
function cutAt(at: number, cut: () => unknown): (confirmed: number) => void {
  let fired = false
  return (confirmed) => {
    if (fired) {
      const until = performance.now() + 20
      while (performance.now() < until) { /* a slow consumer */ }
    } else if (confirmed >= at) {
      fired = true
      void cut()
    }
  }
}

export function resumeTests(env: EngineEnv): void {
  const { host, transport } = env
  let agent: TransferAgent
  let child: Child | undefined
  beforeAll(async () => {
    agent = await TransferAgent.create({ host, port: 0, name: 'resumer', qpsPerPeer: 2, transport })
  })
  afterAll(async () => {
    await child?.stop()
    agent?.close()
  })

  /** A write of `blocks`, failed by `cut()` once `at` of its bytes are confirmed. */
  async function cutWrite(peer: Peer, blocks: Block[] | BlockArrays, bytes: number, at: number, cut: () => unknown): Promise<TransferError> {
    const onProgress = cutAt(at, cut)
    const outcome = await within(agent.write(peer, blocks, { onProgress, timeoutMs: 600_000 }).then(() => 'done', (e: unknown) => e), 660_000, 'the write to fail')
    expect(outcome, `the write failed (cut at ${at} of ${bytes} bytes)`).toBeInstanceOf(TransferError)
    return outcome as TransferError
  }

  describe(`resume (${transport})`, () => {
    it(`a ${LARGE / MiB} MiB write cut by the peer's agent restarting (on memory it keeps) resumes with onRestart 'keep': every block right, resent bytes within 1.1x of the bytes missing`, async () => {
      const BLOCK = 64 << 10
      const COUNT = LARGE / BLOCK
      child = await startChild(env, { size: LARGE })
      const src = agent.register('large', { size: LARGE })
      const expected = fillBlocks(src, BLOCK, COUNT)
      const blocks: BlockArrays = {
        local: src, remote: 'kv', blockSize: BLOCK,
        localOffsets: Float64Array.from({ length: COUNT }, (_, i) => i * BLOCK),
        remoteOffsets: Float64Array.from({ length: COUNT }, (_, i) => perm(i, COUNT) * BLOCK),
      }
      const peer = await agent.connect({ host, port: child.port, timeoutMs: 20_000 })
      let restarted: Promise<void> | undefined
      const failed = await cutWrite(peer, blocks, LARGE, 0.4 * LARGE, () => (restarted = child!.restart()))
      await restarted
      const before = await rightAtPeer(child, expected, BLOCK)
      // Landed means landed: every block reported is right at the peer (its memory was kept).
      for (let i = 0; i < COUNT; i++) if (failed.blockLanded(i) && !before[i]) expect.fail(`block ${i} is reported landed but is not right at the peer`)
      expect(failed.blocksLanded, `${failed.code}: cut mid-transfer`).toBeGreaterThan(0)
      expect(failed.blocksLanded).toBeLessThan(COUNT)
      const missing = before.filter((ok) => !ok).length * BLOCK
      const result = await within(agent.resume(failed, { onRestart: 'keep', timeoutMs: 600_000 }), 660_000, 'the resume')
      expect(result.restarted, 'a new incarnation answered').toBe(true)
      expect(result.bytes, 'sent: the blocks not reported landed').toBe(LARGE - failed.bytesLanded)
      expect(result.bytesSkipped).toBe(failed.bytesLanded)
      expect(result.blocksSkipped).toBe(failed.blocksLanded)
      expect(result.bytes, 'resent within 1.1x of what the peer was missing').toBeLessThanOrEqual(1.1 * missing)
      const after = await rightAtPeer(child, expected, BLOCK)
      expect(after.filter((ok) => !ok).length, 'blocks not right at the peer after the resume').toBe(0)
      console.log(`figures: resume ${transport} ${LARGE / MiB} MiB in ${COUNT} blocks: cut (${failed.code}) with ${failed.bytesLanded / MiB} MiB reported landed, ${missing / MiB} MiB missing at the peer, ${result.bytes / MiB} MiB resent (${(result.bytes / missing).toFixed(3)}x) in ${Math.round(result.ms)} ms`)
      await agent.unregister(src)
      await child.stop()
      child = undefined
    }, 900_000)

    it('a peer process killed and restarted has fresh memory: a resume while it is gone fails resumably, what landed is gone there, onRestart \'fail\' refuses (ERR_PEER_RESTARTED), the default sends every block again', async () => {
      const SIZE = 64 * MiB
      const BLOCK = 16 << 10
      const COUNT = SIZE / BLOCK
      child = await startChild(env, { size: SIZE })
      const port = child.port
      const src = agent.register('killed', { size: SIZE })
      const expected = fillBlocks(src, BLOCK, COUNT)
      const blocks: Block[] = Array.from({ length: COUNT }, (_, i) => ({ local: [src, i * BLOCK], remote: ['kv', perm(i, COUNT) * BLOCK], length: BLOCK }))
      const peer = await agent.connect({ host, port, timeoutMs: 20_000 })
      const first = child
      const failed = await cutWrite(peer, blocks, SIZE, 0.3 * SIZE, () => first.process.kill('SIGKILL'))
      await within(new Promise((resolve) => first.process.exitCode !== null || first.process.signalCode !== null ? resolve(0) : first.process.once('exit', resolve)), 10_000, 'the child to exit')
      expect(failed.blocksLanded).toBeGreaterThan(0)
      // While it is gone: the reconnect fails, and that failure is resumable, its report unchanged.
      const whileGone = await within(agent.resume(failed, { timeoutMs: 15_000 }).catch((e: unknown) => e), 20_000, 'a resume while the peer is gone')
      expect(whileGone, 'a resumable TransferError').toBeInstanceOf(TransferError)
      const gone = whileGone as TransferError
      expect(typeof gone.code).toBe('string')
      expect({ blocks: gone.blocksLanded, bytes: gone.bytesLanded, bitmap: Buffer.from(gone.landedBlocks).equals(failed.landedBlocks) })
        .toEqual({ blocks: failed.blocksLanded, bytes: failed.bytesLanded, bitmap: true })
      child = await startChild(env, { port, size: SIZE })
      const fresh = await rightAtPeer(child, expected, BLOCK)
      expect(fresh.filter((ok) => ok).length, 'nothing of the first write is in the new process').toBe(0)
      const refused = await within(agent.resume(gone, { onRestart: 'fail', timeoutMs: 60_000 }).catch((e: unknown) => e), 70_000, 'the refused resume')
      expect(refused).toMatchObject({ code: 'ERR_PEER_RESTARTED' })
      expect(refused).not.toBeInstanceOf(TransferError)
      const result = await within(agent.resume(gone, { timeoutMs: 120_000 }), 130_000, 'the resume')
      expect(result).toMatchObject({ restarted: true, bytes: SIZE, blocks: COUNT, blocksSkipped: 0, bytesSkipped: 0 })
      const after = await rightAtPeer(child, expected, BLOCK)
      expect(after.filter((ok) => !ok).length, 'blocks not right at the peer after the resume').toBe(0)
      await agent.unregister(src)
      await child.stop()
      child = undefined
    }, 300_000)

    it('a link dropped twice without a restart: each resume sends only what did not land, a failed resume reports over the original blocks, and the refusals are coded', async () => {
      const SIZE = 64 * MiB
      const BLOCK = 16 << 10
      const COUNT = SIZE / BLOCK
      child = await startChild(env, { size: SIZE })
      const src = agent.register('dropped', { size: SIZE })
      const expected = fillBlocks(src, BLOCK, COUNT)
      const blocks: Block[] = Array.from({ length: COUNT }, (_, i) => ({ local: [src, i * BLOCK], remote: ['kv', perm(i, COUNT) * BLOCK], length: BLOCK }))
      const peer = await agent.connect({ host, port: child.port, timeoutMs: 20_000 })
      const failed = await cutWrite(peer, blocks, SIZE, 0.3 * SIZE, () => child!.drop())
      expect(failed.blocksLanded).toBeGreaterThan(0)
      // Resumed, and cut again at its first batch confirmed.
      const onProgress = cutAt(0, () => child!.drop())
      const again = await within(agent.resume(failed, { onProgress, timeoutMs: 120_000 }).then(() => 'done', (e: unknown) => e), 130_000, 'the resume cut again')
      expect(again, 'the resume failed').toBeInstanceOf(TransferError)
      const second = again as TransferError
      expect(second.landedBlocks.length, 'a bitmap over the original blocks').toBe(COUNT / 8)
      expect(second.bytes).toBe(SIZE)
      for (let i = 0; i < COUNT; i++) if (failed.blockLanded(i) && !second.blockLanded(i)) expect.fail(`block ${i} landed in the first attempt but not in the second report`)
      expect(second.blocksLanded, 'the resume landed some before it was cut').toBeGreaterThan(failed.blocksLanded)
      expect(second.bytesLanded).toBe(second.blocksLanded * BLOCK)
      const between = await rightAtPeer(child, expected, BLOCK)
      for (let i = 0; i < COUNT; i++) if (second.blockLanded(i) && !between[i]) expect.fail(`block ${i} is reported landed but is not right at the peer`)
      const result = await within(agent.resume(second, { timeoutMs: 120_000 }), 130_000, 'the last resume')
      expect(result).toMatchObject({ restarted: false, bytes: SIZE - second.bytesLanded, bytesSkipped: second.bytesLanded, blocksSkipped: second.blocksLanded })
      expect((await rightAtPeer(child, expected, BLOCK)).filter((ok) => !ok).length, 'blocks not right at the peer').toBe(0)

      // Refusals: not a TransferError; one no transfer of this agent raised; a bad option; a closed peer.
      await expect(agent.resume(new Error('x') as TransferError)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      const forged = new TransferError('forged', { code: 'ECONNRESET', bytes: 1, peer: peer.id, bytesLanded: 0, blocksLanded: 0, landedBlocks: new Uint8Array(1) })
      await expect(agent.resume(forged)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_VALUE' })
      const other = await TransferAgent.create({ host, port: 0, transport })
      try {
        await expect(other.resume(second)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_VALUE' })
      } finally {
        other.close()
      }
      await expect(agent.resume(second, { onRestart: 'later' as 'keep' })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      agent.closePeer(peer)
      await expect(agent.resume(second)).rejects.toMatchObject({ code: 'ERR_CLOSED' })
      await agent.unregister(src)
      await child.stop()
      child = undefined
    }, 300_000)
  })
}
