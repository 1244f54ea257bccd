// Every operation moves exactly the right bytes: checked in the destination memory.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { Access, remoteRegion, type Device } from '../../dist/index.js'
import { connectedPair, openTestPair, pattern, setU64, srqPair, u64, type Side } from './helpers.js'

const SIZE = 4 << 20
let device: Device
let a: Side
let b: Side
let closePair: (() => void) | undefined // the pair and the device

beforeAll(async () => { ({ device, a, b, close: closePair } = await openTestPair({ size: SIZE, qp: { maxSendSge: 4, maxRecvSge: 4, maxInlineData: 128 } })) })
afterAll(() => closePair?.())

const bytesOf = (side: Side, offset: number, length: number) => side.region.bytes.subarray(offset, offset + length)

describe('one-sided and two-sided operations', () => {
  it.each([1, 4096, 65536, 1 << 20, 3 << 20])('WRITE of %i bytes lands exactly, and nothing around it changes', async (size) => {
    const data = pattern(size, size)
    bytesOf(a, 0, size).set(data)
    b.region.bytes.fill(0xee)
    const remote = remoteRegion(JSON.parse(JSON.stringify(b.region.describe())))
    await a.qp.write(a.region.slice(0, size), remote.slice(512, size))
    expect(Buffer.compare(bytesOf(b, 512, size), data)).toBe(0)
    expect(b.region.bytes[511]).toBe(0xee)
    expect(b.region.bytes[512 + size]).toBe(0xee)
  })

  it.each([1, 4096, 1 << 20])('READ of %i bytes brings back the remote bytes', async (size) => {
    const data = pattern(size, 99 + size)
    bytesOf(b, 4096, size).set(data)
    a.region.bytes.fill(0)
    await a.qp.read(a.region.slice(8192, size), b.region.asRemote().slice(4096, size))
    expect(Buffer.compare(bytesOf(a, 8192, size), data)).toBe(0)
  })

  it.each([1, 1024, 65536, 1 << 20])('SEND/RECV of %i bytes', async (size) => {
    const data = pattern(size, 7 * size)
    bytesOf(a, 0, size).set(data)
    const received = b.qp.recv(b.region.slice(0, SIZE))
    await a.qp.send(a.region.slice(0, size))
    const wc = await received
    expect(wc.byteLength).toBe(size)
    expect(wc.opcode).toBe('RECV')
    expect(wc.immediate).toBeUndefined()
    expect(Buffer.compare(bytesOf(b, 0, size), data)).toBe(0)
  })

  it('SEND_WITH_IMM delivers the immediate with the bytes', async () => {
    bytesOf(a, 0, 5).set([1, 2, 3, 4, 5])
    const received = b.qp.recv(b.region.slice(100, 64))
    await a.qp.send(a.region.slice(0, 5), { immediate: 0xdeadbeef })
    const wc = await received
    expect(wc.immediate).toBe(0xdeadbeef)
    expect(wc.byteLength).toBe(5)
    expect([...bytesOf(b, 100, 5)]).toEqual([1, 2, 3, 4, 5])
  })

  it('WRITE_WITH_IMM writes the bytes and the immediate reaches the receiver', async () => {
    const data = pattern(3000, 3)
    bytesOf(a, 0, 3000).set(data)
    const received = b.qp.recv([])
    await a.qp.write(a.region.slice(0, 3000), b.region.asRemote().slice(20000, 3000), { immediate: 42 })
    const wc = await received
    expect(wc.opcode).toBe('RECV_RDMA_WITH_IMM')
    expect(wc.immediate).toBe(42)
    expect(Buffer.compare(bytesOf(b, 20000, 3000), data)).toBe(0)
  })

  it('gathers from several local slices and scatters into several receive slices', async () => {
    const parts = [pattern(100, 1), pattern(300, 2), pattern(7, 3)]
    bytesOf(a, 0, 100).set(parts[0]!)
    bytesOf(a, 1000, 300).set(parts[1]!)
    bytesOf(a, 5000, 7).set(parts[2]!)
    const received = b.qp.recv([b.region.slice(0, 50), b.region.slice(10000, 400)])
    await a.qp.send([a.region.slice(0, 100), a.region.slice(1000, 300), a.region.slice(5000, 7)])
    const wc = await received
    expect(wc.byteLength).toBe(407)
    const sent = Buffer.concat(parts.map((p) => Buffer.from(p)))
    const got = Buffer.concat([Buffer.from(bytesOf(b, 0, 50)), Buffer.from(bytesOf(b, 10000, 357))])
    expect(Buffer.compare(got, sent)).toBe(0)
    // gather WRITE into one remote slice
    await a.qp.write([a.region.slice(0, 100), a.region.slice(1000, 300)], b.region.asRemote().slice(60000, 400))
    expect(Buffer.compare(Buffer.from(bytesOf(b, 60000, 400)), sent.subarray(0, 400))).toBe(0)
  })

  it('sends inline data (copied at post time)', async () => {
    bytesOf(a, 0, 64).set(pattern(64, 64))
    const received = b.qp.recv(b.region.slice(0, 64))
    const sending = a.qp.send(a.region.slice(0, 64), { inline: true })
    a.region.bytes.fill(0, 0, 64) // already copied into the work request
    await sending
    await received
    expect(Buffer.compare(bytesOf(b, 0, 64), pattern(64, 64))).toBe(0)
    await expect(a.qp.send(a.region.slice(0, 4096), { inline: true })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
  })

  it('zero-length WRITE and READ complete without touching memory', async () => {
    b.region.bytes.fill(0x55, 0, 16)
    await a.qp.write([], b.region.asRemote().slice(0, 0))
    await a.qp.read([], b.region.asRemote().slice(0, 0))
    expect([...bytesOf(b, 0, 16)].every((x) => x === 0x55)).toBe(true)
  })

  it('fetch-and-add returns the old value and adds, also with carries past 32 bits', async () => {
    setU64(b.region, 64, 0xfffffffen)
    const remote = b.region.asRemote().slice(64, 8)
    expect(await a.qp.fetchAndAdd(remote, 3n)).toBe(0xfffffffen)
    expect(u64(b.region, 64)).toBe(0x100000001n)
    expect(await a.qp.fetchAndAdd(remote, 0xffffffffffffffffn)).toBe(0x100000001n) // wraps: adds -1
    expect(u64(b.region, 64)).toBe(0x100000000n)
  })

  it('compare-and-swap swaps only when equal, including equal compare and swap values', async () => {
    setU64(b.region, 128, 10n)
    const remote = b.region.asRemote().slice(128, 8)
    expect(await a.qp.compareAndSwap(remote, 11n, 99n)).toBe(10n) // mismatch: no swap
    expect(u64(b.region, 128)).toBe(10n)
    expect(await a.qp.compareAndSwap(remote, 10n, 0xfedcba9876543210n)).toBe(10n)
    expect(u64(b.region, 128)).toBe(0xfedcba9876543210n)
    expect(await a.qp.compareAndSwap(remote, 0xfedcba9876543210n, 0xfedcba9876543210n)).toBe(0xfedcba9876543210n)
    expect(u64(b.region, 128)).toBe(0xfedcba9876543210n)
    // into a caller-provided local slice
    const local = a.region.slice(256, 8)
    expect(await a.qp.compareAndSwap(remote, 1n, 2n, { local })).toBe(0xfedcba9876543210n)
    expect(u64(a.region, 256)).toBe(0xfedcba9876543210n)
  })

  it('concurrent atomics from one QP are each applied once', async () => {
    setU64(b.region, 192, 0n)
    const remote = b.region.asRemote().slice(192, 8)
    const olds = await Promise.all(Array.from({ length: 500 }, () => a.qp.fetchAndAdd(remote, 1n)))
    expect(u64(b.region, 192)).toBe(500n)
    expect(new Set(olds.map(String)).size).toBe(500) // each saw a different old value
  })

  it.each(['last', 'each'] as const)('postBatch with completions "%s" posts many writes with one call', async (completions) => {
    const n = 200
    for (let i = 0; i < n; i++) bytesOf(a, i * 64, 64).set(pattern(64, i + (completions === 'each' ? 1000 : 0)))
    const remote = b.region.asRemote()
    await a.qp.postBatch(Array.from({ length: n }, (_, i) => ({ op: 'write' as const, local: a.region.slice(i * 64, 64), remote: remote.slice(100000 + i * 64, 64) })), { completions })
    for (let i = 0; i < n; i++) expect(Buffer.compare(bytesOf(b, 100000 + i * 64, 64), pattern(64, i + (completions === 'each' ? 1000 : 0)))).toBe(0)
    expect(a.qp.outstanding).toBe(0)
  })

  it('queues requests beyond the send queue depth instead of failing', async () => {
    const n = 1000 // maxSendWr is 256
    const remote = b.region.asRemote()
    for (let i = 0; i < n; i++) a.region.bytes[i] = i & 0xff
    await Promise.all(Array.from({ length: n }, (_, i) => a.qp.write(a.region.slice(i, 1), remote.slice(200000 + i, 1))))
    for (let i = 0; i < n; i++) expect(b.region.bytes[200000 + i]).toBe(i & 0xff)
  })

  it('registers a JS Buffer and ArrayBuffer zero-copy', async () => {
    const buffer = Buffer.alloc(8192)
    const jsRegion = b.pd.registerMemory(buffer, Access.LocalWrite | Access.RemoteWrite)
    const ab = new ArrayBuffer(4096)
    const abRegion = a.pd.registerMemory(ab, Access.LocalWrite)
    new Uint8Array(ab).set(pattern(4096, 5))
    await a.qp.write(abRegion.slice(), jsRegion.asRemote().slice(4096, 4096))
    expect(Buffer.compare(buffer.subarray(4096), pattern(4096, 5))).toBe(0)
    jsRegion.deregister()
    abRegion.deregister()
  })

  it('busy-poll completion queues move the same bytes', async () => {
    const pair = await connectedPair(device, { size: 65536, pollMode: 'busy' })
    try {
      pair.a.region.bytes.set(pattern(65536, 11))
      await pair.a.qp.write(pair.a.region.slice(), pair.b.region.asRemote().slice())
      expect(Buffer.compare(pair.b.region.bytes, pattern(65536, 11))).toBe(0)
      setU64(pair.b.region, 0, 5n)
      expect(await pair.a.qp.fetchAndAdd(pair.b.region.asRemote().slice(0, 8), 1n)).toBe(5n)
    } finally {
      pair.close()
    }
  })
})

describe('shared receive queues and UD', () => {
  it('a shared receive queue feeds receives to a QP', async () => {
    const { srq, region, receiver, sender, close } = await srqPair(device)
    try {
      const first = srq.recv(region.slice(0, 1024))
      const second = srq.recv(region.slice(1024, 1024))
      region.bytes.set(pattern(100, 1), 2048)
      region.bytes.set(pattern(200, 2), 3072)
      await sender.send(region.slice(2048, 100))
      await sender.send(region.slice(3072, 200))
      const [w1, w2] = await Promise.all([first, second])
      expect(w1.byteLength).toBe(100)
      expect(w2.byteLength).toBe(200)
      expect(w1.qpn).toBe(receiver.qpn)
      expect(Buffer.compare(region.bytes.subarray(0, 100), pattern(100, 1))).toBe(0)
      expect(Buffer.compare(region.bytes.subarray(1024, 1224), pattern(200, 2))).toBe(0)
      await expect(receiver.recv(region.slice(0, 10))).rejects.toMatchObject({ code: 'ERR_QP_SRQ' })
    } finally {
      close()
    }
  })

  it('UD send/recv through an address handle, with the GRH in front', async () => {
    const pd = device.allocPd()
    const cq = device.createCq()
    const region = pd.allocRegion(8192, Access.LocalWrite)
    const server = pd.createQp({ type: 'UD', sendCq: cq })
    const client = pd.createQp({ type: 'UD', sendCq: cq })
    try {
      const qkey = 0x1234
      await server.activate({ qkey })
      await client.activate({ qkey })
      const ep = server.endpoint()
      const ah = pd.createAddressHandle({ gid: ep.gid, lid: ep.lid })
      const received = server.recv(region.slice(0, 40 + 512))
      region.bytes.set(pattern(512, 9), 4096)
      await client.send(region.slice(4096, 512), { dest: { ah, qpn: server.qpn, qkey }, immediate: 7 })
      const wc = await received
      expect(wc.byteLength).toBe(40 + 512)
      expect(wc.grh).toBe(true)
      expect(wc.srcQp).toBe(client.qpn)
      expect(wc.immediate).toBe(7)
      expect(Buffer.compare(region.bytes.subarray(40, 552), pattern(512, 9))).toBe(0)
    } finally {
      pd.close()
      cq.close()
    }
  })

  it('a UD QP refuses requests it cannot carry with ERR_QP_TYPE, in the API and in the addon (rxe dereferenced the missing address handle: the process crashed)', async () => {
    const pd = device.allocPd()
    const cq = device.createCq()
    const region = pd.allocRegion(4096, Access.LocalWrite)
    const ud = pd.createQp({ type: 'UD', sendCq: cq })
    try {
      await ud.activate({ qkey: 0x1234 })
      const window = pd.allocMemoryWindow(2)
      await expect(ud.invalidate(window.rkey)).rejects.toMatchObject({ code: 'ERR_QP_TYPE' })
      await expect(ud.bindWindow(window, region.slice(0, 64), Access.RemoteRead)).rejects.toMatchObject({ code: 'ERR_QP_TYPE' })
      // The same requests straight to the addon, past the API's checks: one LOCAL_INV
      // (opcode 7) with no address handle (word 13), then a SEND without one.
      const native = (ud as unknown as { handle: {
        postSend(words: Uint32Array, count: number): void
        sendPoster(words: Uint32Array, cq?: unknown, kind?: number): (...args: number[]) => number
      } }).handle
      const words = new Uint32Array(16)
      words[2] = 7
      expect(thrownCode(() => native.postSend(words, 1))).toBe('ERR_QP_TYPE')
      expect(thrownCode(() => native.sendPoster(words)(0, 1, 0))).toBe('ERR_QP_TYPE')
      expect(thrownCode(() => native.sendPoster(words, undefined, 1)())).toBe('ERR_QP_TYPE') // postOneNoPoll()
      expect(thrownCode(() => native.sendPoster(words, undefined, 2)())).toBe('ERR_QP_TYPE') // postOne()
      expect(thrownCode(() => native.sendPoster(words, undefined, 3))).toBe('ERR_OUT_OF_RANGE')
      words[2] = 0
      expect(thrownCode(() => native.postSend(words, 1))).toBe('ERR_QP_TYPE')
      // Nothing was posted: the QP still sends to itself.
      const ah = pd.createAddressHandle({ gid: ud.endpoint().gid })
      const received = ud.recv(region.slice(0, 40 + 64))
      region.bytes.set(pattern(64, 5), 1024)
      await ud.send(region.slice(1024, 64), { dest: { ah, qpn: ud.qpn, qkey: 0x1234 } })
      await received
      expect(Buffer.compare(region.bytes.subarray(40, 104), pattern(64, 5))).toBe(0)
    } finally {
      pd.close()
      cq.close()
    }
  })
})

/** The code of what `fn` throws ('(nothing thrown)' if it returns). */
function thrownCode(fn: () => unknown): unknown {
  try {
    fn()
  } catch (error) {
    return (error as { code?: unknown }).code
  }
  return '(nothing thrown)'
}
