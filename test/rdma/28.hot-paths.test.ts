// The hot paths (read/write/atomics written straight into a send buffer bound
// once to a plain native post function; polls through a bound native poll
// function) move the right bytes and keep the general path's guarantees.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Device, type RdmaError } from '../../dist/index.js'
import { CQ_DISPATCH } from '../../dist/verbs/completion-queue.js'
import { SEND_POSTER_ONE_POLL } from '../../dist/native/addon.js'
import { internals } from '../internals.js'
import { connectedPair, openTestPair, pattern, setU64, u64, within, type Side } from './helpers.js'

let device: Device
let a: Side
let b: Side
let closePair: (() => void) | undefined // the pair and the device

beforeAll(async () => { ({ device, a, b, close: closePair } = await openTestPair({ size: 1 << 16, pollMode: 'busy' })) })
afterAll(() => closePair?.())

describe('hot paths', () => {
  it('reads and writes back to back: every byte lands, every request settles', async () => {
    const remote = b.region.asRemote()
    for (let i = 0; i < 200; i++) {
      const data = pattern(8, i)
      a.region.bytes.set(data, 0)
      await within(a.qp.write(a.region.slice(0, 8), remote.slice(8 * (i % 64), 8)))
      expect(Buffer.compare(b.region.bytes.subarray(8 * (i % 64), 8 * (i % 64) + 8), data)).toBe(0)
      b.region.bytes.set(pattern(8, 1000 + i), 4096)
      await within(a.qp.read(a.region.slice(1024, 8), remote.slice(4096, 8)))
      expect(Buffer.compare(a.region.bytes.subarray(1024, 1032), pattern(8, 1000 + i))).toBe(0)
    }
    expect(a.qp.outstanding).toBe(0)
    expect(a.region.inflight).toBe(0)
  })

  it('writes gathered in one turn grow the send buffer past its first size and still land (the new buffer is bound)', async () => {
    const remote = b.region.asRemote()
    b.region.bytes.fill(0)
    // 120 writes in one turn: 120 * 20 words is more than the first 1024-word buffer.
    const writes = Array.from({ length: 120 }, (_, i) => {
      a.region.bytes.set(pattern(8, 7 + i), 8192 + 8 * i)
      return a.qp.write(a.region.slice(8192 + 8 * i, 8), remote.slice(8 * i, 8))
    })
    await within(Promise.all(writes))
    for (let i = 0; i < 120; i++) expect(Buffer.compare(b.region.bytes.subarray(8 * i, 8 * i + 8), pattern(8, 7 + i))).toBe(0)
    // And the next single write after the growth uses the bound (new) buffer.
    a.region.bytes.set(pattern(8, 4242), 0)
    await within(a.qp.write(a.region.slice(0, 8), remote.slice(2048, 8)))
    expect(Buffer.compare(b.region.bytes.subarray(2048, 2056), pattern(8, 4242))).toBe(0)
  })

  it('atomics on the hot path return the old value and change the remote word', async () => {
    const remote = b.region.asRemote()
    setU64(b.region, 512, 10n)
    expect(await within(a.qp.fetchAndAdd(remote.slice(512, 8), 5n))).toBe(10n)
    expect(u64(b.region, 512)).toBe(15n)
    expect(await within(a.qp.compareAndSwap(remote.slice(512, 8), 15n, 0x1_0000_0000n))).toBe(15n)
    expect(u64(b.region, 512)).toBe(0x1_0000_0000n)
    // Many in flight at once: each gets a distinct old value.
    setU64(b.region, 520, 0n)
    const olds = await within(Promise.all(Array.from({ length: 16 }, () => a.qp.fetchAndAdd(remote.slice(520, 8), 1n))))
    expect([...olds].sort((x, y) => Number(x - y))).toEqual(Array.from({ length: 16 }, (_, i) => BigInt(i)))
    expect(u64(b.region, 520)).toBe(16n)
  })

  it('postBatch carries atomics: each old value lands in its local slice, the remote words change', async () => {
    const remote = b.region.asRemote()
    setU64(b.region, 256, 40n)
    setU64(b.region, 264, 7n)
    a.region.bytes.fill(0xff, 300, 316)
    b.region.bytes.fill(0, 128, 136)
    a.region.bytes.set(pattern(8, 31), 320)
    await within(a.qp.postBatch([
      { op: 'fetchAndAdd', local: a.region.slice(300, 8), remote: remote.slice(256, 8), add: 2n },
      { op: 'compareAndSwap', local: a.region.slice(308, 8), remote: remote.slice(264, 8), compare: 7n, swap: 0xdead_beef_0000n },
      { op: 'write', local: a.region.slice(320, 8), remote: remote.slice(128, 8) },
    ]))
    expect(u64(a.region, 300)).toBe(40n)
    expect(u64(b.region, 256)).toBe(42n)
    expect(u64(a.region, 308)).toBe(7n)
    expect(u64(b.region, 264)).toBe(0xdead_beef_0000n)
    expect(Buffer.compare(b.region.bytes.subarray(128, 136), pattern(8, 31))).toBe(0)
    await expect(a.qp.postBatch([{ op: 'fetchAndAdd', local: a.region.slice(300, 4), remote: remote.slice(256, 8), add: 1n }]))
      .rejects.toBeInstanceOf(RangeError)
  })

  it('a batch of 32 writes on the hot path lands every write', async () => {
    const remote = b.region.asRemote()
    b.region.bytes.fill(0, 0, 256)
    for (let i = 0; i < 32; i++) a.region.bytes.set(pattern(8, 500 + i), 16384 + 8 * i)
    await within(a.qp.postBatch(Array.from({ length: 32 }, (_, i) => ({ op: 'write' as const, local: a.region.slice(16384 + 8 * i, 8), remote: remote.slice(8 * i, 8) }))))
    for (let i = 0; i < 32; i++) expect(Buffer.compare(b.region.bytes.subarray(8 * i, 8 * i + 8), pattern(8, 500 + i))).toBe(0)
    expect(a.region.inflight).toBe(0)
  })

  it('a batch of data and its notice (a WRITE, a WRITE_WITH_IMM, a SEND_WITH_IMM, a SEND) lands in order: each receive carries its immediate and bytes, the written bytes are in place when the first completes', async () => {
    const remote = b.region.asRemote()
    b.region.bytes.fill(0, 24000, 24200)
    a.region.bytes.set(pattern(64, 11), 20000)
    a.region.bytes.set(pattern(32, 12), 20064)
    a.region.bytes.set(pattern(16, 13), 20096)
    a.region.bytes.set(pattern(8, 14), 20112)
    const inboxes = [0, 1, 2].map((k) => b.region.slice(30000 + 64 * k, 64))
    const received = inboxes.map((slice) => b.qp.recv(slice).then((wc) => ({ wc, written: Buffer.from(b.region.bytes.subarray(24000, 24096)) })))
    await within(a.qp.postBatch([
      { op: 'write', local: a.region.slice(20000, 64), remote: remote.slice(24000, 64) },
      { op: 'write', local: a.region.slice(20064, 32), remote: remote.slice(24064, 32), immediate: 0xfeedf00d },
      { op: 'send', local: a.region.slice(20096, 16), immediate: 42 },
      { op: 'send', local: a.region.slice(20112, 8) },
    ]))
    const [first, second, third] = await within(Promise.all(received))
    expect(first!.wc).toMatchObject({ opcode: 'RECV_RDMA_WITH_IMM', immediate: 0xfeedf00d, byteLength: 32 })
    expect(Buffer.compare(first!.written, Buffer.concat([pattern(64, 11), pattern(32, 12)])), 'both writes in place at the first receive').toBe(0)
    expect(second!.wc).toMatchObject({ opcode: 'RECV', immediate: 42, byteLength: 16 })
    expect(Buffer.compare(b.region.bytes.subarray(30064, 30080), pattern(16, 13))).toBe(0)
    expect(third!.wc).toMatchObject({ opcode: 'RECV', byteLength: 8 })
    expect(third!.wc.immediate).toBeUndefined()
    expect(Buffer.compare(b.region.bytes.subarray(30128, 30136), pattern(8, 14))).toBe(0)
    expect(a.region.inflight).toBe(0)
  })

  it('a hot-path batch of reads and writes over two regions, mode each, some waiting for send slots: every byte lands, each region is held until its batch completes', async () => {
    // A send queue of 8: of three batches of 8 posted at once, two wait for slots and are encoded later.
    const { a: x, b: y, close } = await connectedPair(device, { size: 4096, qp: { maxSendWr: 8 } })
    try {
      const other = x.pd.allocRegion(4096)
      const remote = y.region.asRemote()
      y.region.bytes.set(pattern(1024, 90), 2048)
      const batches = [0, 1, 2].map((k) => Array.from({ length: 8 }, (_, i) => {
        const at = 64 * (8 * k + i)
        const source = i % 2 === 0 ? x.region : other
        if (i % 4 === 3) return { op: 'read' as const, local: source.slice(at, 16), remote: remote.slice(2048 + at % 1024, 16) }
        source.bytes.set(pattern(16, 300 + 8 * k + i), at)
        return { op: 'write' as const, local: source.slice(at, 16), remote: remote.slice(at, 16) }
      }))
      const posted = batches.map((ops) => x.qp.postBatch(ops, { completions: 'each' }))
      expect(() => other.deregister(), 'a region of a batch in flight').toThrow(expect.objectContaining({ code: 'ERR_BUSY' }))
      await within(Promise.all(posted))
      batches.flat().forEach((op, j) => {
        const at = 64 * j
        const source = op.local.region
        if (op.op === 'write') expect(Buffer.compare(y.region.bytes.subarray(at, at + 16), source.bytes.subarray(at, at + 16)), `write ${j}`).toBe(0)
        else expect(Buffer.compare(source.bytes.subarray(at, at + 16), y.region.bytes.subarray(2048 + at % 1024, 2048 + at % 1024 + 16)), `read ${j}`).toBe(0)
      })
      expect([x.region.inflight, other.inflight]).toEqual([0, 0])
      // An empty slice leaves the hot path; the general path posts it with no SGE.
      await within(x.qp.postBatch([{ op: 'write', local: x.region.slice(0, 0), remote: remote.slice(0, 0) }, { op: 'write', local: x.region.slice(0, 8), remote: remote.slice(8, 8) }]))
      other.deregister()
    } finally {
      close()
    }
  })

  it('requests of the promises\' fast path that a dead peer never answers are rejected with ERR_CLOSED when their QP closes, and free their regions', async () => {
    // Each try waits 4.096 us * 2^18 (about a second): the requests stay in flight.
    const { a: x, b: y, close } = await connectedPair(device, { size: 4096, connect: { timeout: 18, retryCount: 7 } })
    try {
      y.qp.close()
      const remote = y.region.asRemote()
      const nextTurn = () => new Promise((resolve) => setImmediate(resolve))
      // One per turn: each is the first of its turn, so each takes the fast path.
      const write = x.qp.write(x.region.slice(0, 8), remote.slice(0, 8)).catch((e: RdmaError) => e)
      await nextTurn()
      const read = x.qp.read(x.region.slice(8, 8), remote.slice(8, 8)).catch((e: RdmaError) => e)
      await nextTurn()
      const add = x.qp.fetchAndAdd(remote.slice(16, 8), 1n).catch((e: RdmaError) => e)
      await nextTurn()
      expect(x.qp.outstanding).toBe(3)
      expect(x.region.inflight).toBe(2)
      x.qp.close()
      for (const settled of await within(Promise.all([write, read, add]))) expect(settled).toMatchObject({ code: 'ERR_CLOSED' })
      expect(x.qp.outstanding).toBe(0)
      expect(x.region.inflight).toBe(0)
    } finally {
      close()
    }
  })

  it('an atomic whose library-owned result slot cannot be had rejects (it does not throw) and leaks no send slot', async () => {
    const { a: x, b: y, close } = await connectedPair(device, { size: 4096, qp: { maxSendWr: 1 } })
    // The PD has no slots yet: the first atomic registers a page of them with pd.allocRegion(). Made
    // to fail as registering fails over the memlock limit (root in the guest has no limit to hit).
    const pd = x.pd as unknown as { allocRegion: (...args: unknown[]) => unknown }
    try {
      pd.allocRegion = () => { throw Object.assign(new Error('no slot'), { code: 'ENOMEM' }) }
      let result: Promise<bigint> | undefined
      expect(() => { result = x.qp.fetchAndAdd(y.region.asRemote().slice(0, 8), 1n) }).not.toThrow()
      await expect(within(result!)).rejects.toMatchObject({ code: 'ENOMEM' })
      delete (pd as { allocRegion?: unknown }).allocRegion // the prototype's again
      // The QP's only send slot is free: the next requests go through.
      await within(x.qp.read(x.region.slice(0, 8), y.region.asRemote().slice(0, 8)))
      expect(await within(x.qp.fetchAndAdd(y.region.asRemote().slice(0, 8), 1n))).toBeTypeOf('bigint')
      expect(x.qp.outstanding).toBe(0)
    } finally {
      if (Object.hasOwn(pd, 'allocRegion')) delete (pd as { allocRegion?: unknown }).allocRegion
      close()
    }
  })

  it('an empty poll returns 0; a poll of a closed queue says it is closed', () => {
    expect(a.cq.poll()).toBe(0)
    const cq = device.createCq({ entries: 16 })
    cq.close()
    expect(() => cq.poll()).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }))
  })

  it('the hot-path functions leave the count of their poll in the CQ\'s count word (the output\'s last word), never a stale one', async () => {
    type NativeCq = new (context: unknown, entries: number, output: Uint32Array, onCompletions: () => void, compVector: number) => { close(): void }
    const NativeCompletionQueue = (internals(a.cq).handle as unknown as { constructor: NativeCq }).constructor
    // N completions of 16 words, then the count word: any other length is refused.
    for (const length of [0, 16, 32, 18]) {
      expect(() => new NativeCompletionQueue(internals(device).handle, 16, new Uint32Array(length), () => {}, 0), `length ${length}`)
        .toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    }
    new NativeCompletionQueue(internals(device).handle, 16, new Uint32Array(17), () => {}, 0).close()
    // The words the addon polls into (the dispatch's, lib/ops/dispatch.ts) cannot be detached by a transfer.
    const countWord = internals(a.cq)[CQ_DISPATCH].countWord
    structuredClone(countWord, { transfer: [countWord.buffer as ArrayBuffer] }) // an ArrayBuffer: never shared memory
    expect(countWord.buffer.byteLength).toBeGreaterThan(0)
    // Three tagged READs complete; a poll reports what is left of them (the busy CQ's spin may have
    // reported some): the count it returns is the number of reports it delivered.
    const remote = b.region.asRemote()
    const reported: number[] = []
    a.qp.setCompletionHandler((tag, error) => { if (!error) reported.push(tag) })
    try {
      for (let tag = 1; tag <= 3; tag++) a.qp.postRead(a.region.slice(64 * tag, 8), remote.slice(0, 8), tag)
      await new Promise((resolve) => setTimeout(resolve, 50)) // the device completes them; nothing polls meanwhile in this turn
      const before = reported.length
      const polled = a.cq.poll()
      expect(reported.length - before, 'reports the poll delivered').toBe(polled)
      expect(reported.sort()).toEqual([1, 2, 3])
      // An empty poll writes 0 over whatever the word held (a stale 99 would be 99 entries to deliver).
      countWord[0] = 99
      expect(a.cq.poll()).toBe(0)
      expect(countWord[0]).toBe(0)
    } finally {
      a.qp.setCompletionHandler(undefined)
    }
    // The post-and-poll function writes the count of its own poll: on a fresh QP, the function it binds
    // is wrapped to put 99 in the word right before each native call (after the QP zeroed it, which
    // alone would hide a function that never writes the word), and the word is read right after it.
    const { a: x, b: y, close } = await connectedPair(device, { size: 4096, pollMode: 'busy' })
    try {
      type Post = () => void
      const handle = internals(x.qp).handle as unknown as { sendPoster(words: Uint32Array, cq?: unknown, kind?: number): Post }
      const bind = handle.sendPoster.bind(handle)
      const word = internals(x.cq)[CQ_DISPATCH].countWord
      const seen: number[] = []
      const wrapped = (words: Uint32Array, cq?: unknown, kind?: number): Post => {
        const post = bind(words, cq, kind)
        return kind === SEND_POSTER_ONE_POLL ? () => { word[0] = 99; post(); seen.push(word[0]!) } : post
      }
      Object.defineProperty(handle, 'sendPoster', { value: wrapped }) // the addon's method is read-only: an own property shadows it
      const remoteY = y.region.asRemote()
      // The first takes the general path (it asks the port's max message size once); the others the fast path.
      for (let i = 0; i < 4; i++) await within(x.qp.read(x.region.slice(0, 8), remoteY.slice(0, 8)))
      expect(seen.length, 'reads posted by the post-and-poll function').toBeGreaterThan(0)
      expect(seen.filter((n) => n > 1), 'counts the post-and-poll function left (0 or 1: its own request)').toEqual([])
    } finally {
      close()
    }
  })

  it('the first send of a turn is posted at once, the rest of the turn together: one native call for them (docs/api.md)', async () => {
    const { a: x, b: y, close } = await connectedPair(device, { size: 4096 })
    try {
      // Count the calls of the native post functions the QP binds (it binds them on first use, after this).
      type Post = (...args: number[]) => unknown
      const handle = internals(x.qp).handle as unknown as { sendPoster(words: Uint32Array, cq?: unknown, kind?: number): Post }
      const bind = handle.sendPoster.bind(handle)
      let single = 0
      const batches: number[] = [] // the count of each batch post
      const counting = (words: Uint32Array, cq?: unknown, kind?: number): Post => {
        const post = bind(words, cq, kind)
        return kind ? () => { single++; return post() } : (start, count, poll) => { batches.push(count); return post(start, count, poll) }
      }
      Object.defineProperty(handle, 'sendPoster', { value: counting }) // the addon's method is read-only: an own property shadows it
      const remote = y.region.asRemote()
      // A fresh QP's first request takes the general path (it asks the port's max message size once).
      await within(x.qp.read(x.region.slice(0, 8), remote.slice(0, 8)))
      single = 0
      batches.length = 0
      for (let i = 0; i < 8; i++) x.region.bytes.set(pattern(8, 50 + i), 8 * i)
      const writes = Array.from({ length: 8 }, (_, i) => x.qp.write(x.region.slice(8 * i, 8), remote.slice(8 * i, 8)))
      await within(Promise.all(writes))
      expect(single).toBe(1)
      expect(batches).toEqual([7])
      for (let i = 0; i < 8; i++) expect(Buffer.compare(y.region.bytes.subarray(8 * i, 8 * i + 8), pattern(8, 50 + i))).toBe(0)
      // The next turn starts again with a post of its own.
      await within(x.qp.read(x.region.slice(0, 8), remote.slice(0, 8)))
      expect(single).toBe(2)
      expect(batches).toEqual([7])
    } finally {
      close()
    }
  })

  it('a closed queue pair or region is refused on the hot path with the general path\'s errors', async () => {
    const { a: x, b: y, close } = await connectedPair(device, { size: 4096 })
    try {
      await within(x.qp.read(x.region.slice(0, 8), y.region.asRemote().slice(0, 8)))
      const spare = x.pd.allocRegion(4096)
      const slice = spare.slice(0, 8) // taken while open: slice() of a closed region throws by itself
      spare.close()
      await expect(x.qp.write(slice, y.region.asRemote().slice(0, 8))).rejects.toMatchObject({ code: 'ERR_CLOSED' })
      x.qp.close()
      await expect(x.qp.write(x.region.slice(0, 8), y.region.asRemote().slice(0, 8))).rejects.toMatchObject({ code: 'ERR_CLOSED' })
      await expect(x.qp.fetchAndAdd(y.region.asRemote().slice(0, 8), 1n)).rejects.toMatchObject({ code: 'ERR_CLOSED' })
    } finally {
      close()
    }
  })
})
