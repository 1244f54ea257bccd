// The peer's process is killed mid-transfer: the transfer rejects within its
// bound with a coded error that says how many bytes landed; the next transfer
// fails fast while the peer is gone, and succeeds on fresh QPs once it is back.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { TransferAgent, TransferError, type Block } from '../../dist/index.js'
import { pattern, within } from './helpers.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const MiB = 1 << 20
const SIZE = 8 * MiB

interface Child { process: ChildProcess; port: number; sum: (offset: number, length: number) => Promise<number>; stop: () => Promise<void> }

function startChild(port = 0): Promise<Child> {
  const script = fileURLToPath(new URL('./fixtures/transfer-peer.mjs', import.meta.url))
  const child = spawn(process.execPath, [script, host, String(port), String(SIZE)], { stdio: ['pipe', 'pipe', 'inherit'] })
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
        child.stdin!.end()
        setTimeout(() => child.kill('SIGKILL'), 10_000).unref()
      }),
    }
  }), 60_000, 'the child agent to start')
}

function popcount(byte: number): number {
  let n = 0
  for (let b = byte; b !== 0; b >>= 1) n += b & 1
  return n
}

function checksum(bytes: Uint8Array): number {
  let sum = 0
  for (const byte of bytes) sum = (sum * 31 + byte) >>> 0
  return sum
}

let agent: TransferAgent
let child: Child | undefined

beforeAll(async () => {
  agent = await TransferAgent.create({ host, port: 0, name: 'parent', qpsPerPeer: 2 })
})
afterAll(async () => {
  await child?.stop()
  agent?.close()
})

describe('a peer process killed mid-transfer', () => {
  it('rejects within the bound with bytes landed, fails fast while the peer is gone, and succeeds on fresh QPs after a restart', async () => {
    child = await startChild()
    const port = child.port
    const src = agent.register('src', { size: SIZE })
    src.bytes.set(pattern(SIZE, 5))
    const peer = await agent.connect({ host, port, timeoutMs: 20_000 })
    // 4 KiB blocks, shuffled over the peer's segment: many work requests in flight.
    const blocks: Block[] = Array.from({ length: SIZE / 4096 }, (_, i) => ({ local: [src, i * 4096], remote: ['kv', ((i * 4099) % (SIZE / 4096)) * 4096], length: 4096 }))
    await within(agent.write(peer, blocks.slice(0, 256), { timeoutMs: 30_000 }), 35_000, 'a first write')
    const qpnsBefore = (peer as unknown as { link: { qps: Array<{ qpn: number }> } }).link.qps.map((qp) => qp.qpn)

    // Keep writing; kill the child once the first of these transfers has been posted.
    const TIMEOUT = 20_000
    const transfers = Array.from({ length: 4 }, () => agent.write(peer, blocks, { timeoutMs: TIMEOUT }).then(() => 'done', (e) => e))
    await new Promise((resolve) => setTimeout(resolve, 200))
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
    child = await startChild(port)
    const result = await within(agent.write(peer, blocks, { timeoutMs: 60_000 }), 65_000, 'the write after the restart')
    expect(result.bytes).toBe(SIZE)
    expect(peer.state).toBe('connected')
    const qpnsAfter = (peer as unknown as { link: { qps: Array<{ qpn: number }> } }).link.qps.map((qp) => qp.qpn)
    expect(qpnsAfter.some((qpn) => qpnsBefore.includes(qpn)), 'no QP of the dead link reused').toBe(false)
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
