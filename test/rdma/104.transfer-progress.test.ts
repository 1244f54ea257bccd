// What a failed transfer says landed, and bounds by progress: against an
// agent in its own process (fixtures/transfer-peer.mjs, its segment filled
// with pattern(SIZE, SEED)). A transfer whose completions keep coming is not
// failed by a stall bound shorter than it; a peer that stops answering fails
// it with ERR_STALLED within that bound; a peer killed mid-read leaves a
// bitmap of landed blocks that are exactly the ones completions confirmed,
// every one byte-correct here.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { TransferAgent, TransferError, type Block, type Peer } from '../../dist/index.js'
import { pattern, within } from './helpers.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const MiB = 1 << 20
const SIZE = 64 * MiB
const SEED = 11
const BLOCK = 4096

interface Child { process: ChildProcess; port: number; sum: (offset: number, length: number) => Promise<number>; stop: () => Promise<void> }

function startChild(): Promise<Child> {
  const script = fileURLToPath(new URL('./fixtures/transfer-peer.mjs', import.meta.url))
  const child = spawn(process.execPath, [script, host, '0', String(SIZE), String(SEED)], { stdio: ['pipe', 'pipe', 'inherit'] })
  let out = ''
  const waiters: Array<(line: string) => void> = []
  child.stdout!.on('data', (chunk) => {
    out += chunk
    let nl
    while ((nl = out.indexOf('\n')) >= 0) {
      const line = out.slice(0, nl)
      out = out.slice(nl + 1)
      waiters.shift()?.(line)
    }
  })
  const nextLine = () => new Promise<string>((resolve) => waiters.push(resolve))
  return within(nextLine().then((line) => {
    const match = line.match(/^listening (\d+)/)
    if (!match) throw new Error(`child said: ${line}`)
    return {
      process: child,
      port: Number(match[1]),
      sum: async (offset: number, length: number) => {
        const reply = nextLine()
        child.stdin!.write(`sum ${offset} ${length}\n`)
        return Number((await within(reply, 30_000, 'the child\'s checksum')).split(' ')[1])
      },
      stop: () => new Promise<void>((done) => {
        if (child.exitCode !== null || child.signalCode !== null) return done()
        child.once('exit', () => done())
        child.kill('SIGCONT')
        child.stdin!.end()
        setTimeout(() => child.kill('SIGKILL'), 10_000).unref()
      }),
    }
  }), 120_000, 'the child agent to start')
}

function checksum(bytes: Uint8Array): number {
  let sum = 0
  for (const byte of bytes) sum = (sum * 31 + byte) >>> 0
  return sum
}

const isLanded = (bitmap: Uint8Array, i: number): boolean => ((bitmap[i >> 3]! >> (i & 7)) & 1) === 1

const expected = pattern(SIZE, SEED) // the child's segment
let agent: TransferAgent
let child: Child | undefined
let peer: Peer

beforeAll(async () => {
  agent = await TransferAgent.create({ host, port: 0, name: 'parent', qpsPerPeer: 2 })
  child = await startChild()
  peer = await agent.connect({ host, port: child.port, timeoutMs: 20_000 })
}, 180_000)
afterAll(async () => {
  await child?.stop()
  agent?.close()
})

describe('bounds by progress', () => {
  it('bounds and progress listeners that are not what they must be are refused with a code, before anything is posted', async () => {
    const src = agent.register('bad', { size: BLOCK })
    src.bytes.set(expected.subarray(0, BLOCK)) // what the peer has there: the write that lands changes nothing
    const blocks: Block[] = [{ local: [src, 0], remote: ['kv', 0], length: BLOCK }]
    await expect(agent.write(peer, blocks, { stallTimeoutMs: 0 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    await expect(agent.write(peer, blocks, { stallTimeoutMs: 'soon' as unknown as number })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    await expect(agent.write(peer, blocks, { onProgress: 42 as unknown as () => void })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    await expect(TransferAgent.create({ host, stallTimeoutMs: -1 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    await expect(TransferAgent.create({ host, transferTimeoutMs: 1.5 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
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
    const result = await within(agent.read(peer, blocks, { stallTimeoutMs: STALL, onProgress: (bytes) => progress.push(bytes) }), 120_000, 'the read')
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
    // Frozen: its device still answers RDMA, but its process posts no more
    // receives: once the control QP's posted receives are used up, a
    // notification is NAKed (RNR) and retried forever. No completion comes.
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
    expect(stalled, 'a notified write stalled once the frozen peer\'s receives were used up').toBeDefined()
    expect(stalled!.code).toBe('ERR_STALLED')
    expect(elapsed, 'failed within stallTimeoutMs + 1 s').toBeLessThanOrEqual(STALL + 1000)
    // The data was acknowledged by the peer's device before the notification stalled: every block landed.
    expect(stalled!.landedBlocks).toBeInstanceOf(Uint8Array)
    expect(stalled!.landedBlocks.length).toBe(2)
    for (let i = 0; i < 16; i++) expect(isLanded(stalled!.landedBlocks, i), `block ${i} reported landed`).toBe(true)
    expect(stalled!.bytesLanded).toBe(16 * BLOCK)
    child!.process.kill('SIGCONT')
    for (let i = 0; i < 16; i++) expect(await child!.sum(at(i), BLOCK), `block ${i} at the peer`).toBe(checksum(src.bytes.subarray(i * BLOCK, (i + 1) * BLOCK)))
    await agent.unregister(src)
  }, 240_000)
})

describe('landed blocks after the peer is killed', () => {
  it('completions still in the CQ when the link closes count as landed (the transfer rejects after they are delivered)', async () => {
    const COUNT = 8192
    const dst = agent.register('closing', { size: COUNT * BLOCK })
    const remoteAt = (i: number): number => ((i * 4099) % COUNT) * BLOCK
    const blocks: Block[] = Array.from({ length: COUNT }, (_, i) => ({ local: [dst, i * BLOCK], remote: ['kv', remoteAt(i)], length: BLOCK }))
    let atClose = -1
    const outcome = await within(agent.read(peer, blocks, {
      onProgress: (confirmed) => {
        if (atClose >= 0) return
        atClose = confirmed
        // Busy for a while: the device completes the batches in flight into
        // the CQ, and nothing polls it. Then the link closes: closing its QPs
        // delivers those completions.
        const until = performance.now() + 100
        while (performance.now() < until) { /* busy */ }
        agent.closePeer(peer)
      },
    }).then(() => 'done', (e: unknown) => e), 60_000, 'the read to settle after closePeer')
    expect(outcome).toBeInstanceOf(TransferError)
    const error = outcome as TransferError
    expect(error.code).toBe('ERR_CLOSED')
    expect(error.bytesLanded, 'the completions delivered by the close were counted').toBeGreaterThan(atClose)
    for (let i = 0; i < COUNT; i++) {
      if (!error.blockLanded(i)) continue
      const at = remoteAt(i)
      if (Buffer.compare(dst.bytes.subarray(i * BLOCK, (i + 1) * BLOCK), expected.subarray(at, at + BLOCK)) !== 0) expect.fail(`block ${i} is reported landed but its bytes are not the peer's`)
    }
    expect(error.bytesLanded).toBe(error.blocksLanded * BLOCK)
    await agent.unregister(dst)
    peer = await agent.connect({ host, port: child!.port, timeoutMs: 20_000 })
  }, 120_000)

  it('a read cut by a kill reports the blocks completions confirmed, each one byte-correct here, and their bytes as bytesLanded', async () => {
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
