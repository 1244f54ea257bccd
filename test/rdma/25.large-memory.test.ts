// Memory and transfers above 4 GiB, on the real device.
//
// This file needs a guest with about 10 GiB of memory (softroce.sh --memory 10240;
// scripts/test.mjs sets it): it registers two regions of 4 GiB + 1 MiB and
// moves all of one into the other with a single qp.write(). That is more than
// an SGE's 32-bit length field can name and more than rxe's max message size
// (8 MiB), so the library must split it into 513 work requests (the QP gets
// maxSendWr 1024: a split operation needs one send-queue slot per piece). Every
// byte that arrived is checked: each 1 MiB chunk has its own fill byte and
// carries its index and a seed, so a chunk that lands in the wrong place fails.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { readFileSync } from 'node:fs'
import { Access, NativeMemory, type Device, type MemoryRegion } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, testDevice, type Side } from './helpers.js'

const MiB = 2 ** 20
const GiB = 2 ** 30
const SIZE = 4 * GiB + MiB
const CHUNKS = SIZE / MiB
const TIMEOUT_MS = 1_800_000 // a bound, not a threshold: a hang fails the test

/** The guest's memory in bytes: the test explains itself when it is too small. */
function memTotal(): number {
  const line = readFileSync('/proc/meminfo', 'utf8').split('\n').find((l) => l.startsWith('MemTotal:'))!
  return Number(line.split(/\s+/)[1]) * 1024
}

/** Fills one 1 MiB chunk: a fill byte from (index, seed), then index and seed at both ends. */
function fillChunk(view: Uint8Array, index: number, seed: number): void {
  view.fill((index * 31 + seed * 7 + 1) & 0xff)
  const words = new DataView(view.buffer, view.byteOffset, view.byteLength)
  words.setUint32(0, index, true)
  words.setUint32(4, seed, true)
  words.setUint32(MiB - 8, index, true)
  words.setUint32(MiB - 4, seed, true)
}

function fillRange(region: MemoryRegion, first: number, end: number, seed: number): void {
  for (let i = first; i < end; i++) fillChunk(region.slice(i * MiB, MiB).bytes, i, seed)
}

/** The index of the first chunk in [first, end) that differs from the pattern, or -1. */
function firstBadChunk(region: MemoryRegion, first: number, end: number, seedOf: (index: number) => number): number {
  const expected = new Uint8Array(MiB)
  for (let i = first; i < end; i++) {
    fillChunk(expected, i, seedOf(i))
    if (Buffer.compare(region.slice(i * MiB, MiB).bytes, expected) !== 0) return i
  }
  return -1
}

let device: Device
let a: Side
let b: Side
let close: () => void
beforeAll(async () => {
  if (memTotal() < 9 * GiB) {
    throw new Error(`This file needs a guest with about 10 GiB of memory (two registered regions of 4 GiB + 1 MiB); this one has ${(memTotal() / GiB).toFixed(1)} GiB: run it with scripts/softroce.sh run --memory 10240 (scripts/test.mjs does)`)
  }
  device = testDevice()
  ;({ a, b, close } = await connectedPair(device, { size: SIZE, access: ALL_ACCESS, qp: { maxSendWr: 1024 } }))
}, TIMEOUT_MS)
afterAll(() => { close?.(); device?.close() })

describe('memory above 4 GiB', () => {
  it('registers 4 GiB + 1 MiB; bytes refuses with ERR_VIEW_TOO_LARGE; windows past 4 GiB work', () => {
    expect(a.region.length).toBe(SIZE)
    expect(() => a.region.bytes).toThrow(expect.objectContaining({ code: 'ERR_VIEW_TOO_LARGE' }))
    const tail = a.region.slice(4 * GiB + 4096, 16).bytes
    tail.set([1, 2, 3, 4])
    expect(Array.from(a.region.slice(4 * GiB + 4094, 6).bytes)).toEqual([0, 0, 1, 2, 3, 4])
    expect(() => a.region.slice(0, 4 * GiB + 1).bytes).toThrow(expect.objectContaining({ code: 'ERR_VIEW_TOO_LARGE' }))
    expect(a.region.slice(MiB, 4 * GiB).bytes.byteLength).toBe(NativeMemory.MAX_VIEW_BYTES)
    const small = a.pd.allocRegion(4096 + 1, Access.LocalWrite)
    expect(small.bytes.byteLength).toBe(4097)
    small.close()
  })

  it('refuses bad buffer sizes with coded errors, never a crash', () => {
    for (const size of [0, -1, 1.5, NaN, 2 ** 53]) {
      expect(() => a.pd.allocBuffer(size)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    }
    expect(() => a.pd.allocBuffer(2 ** 52)).toThrow(expect.objectContaining({ code: 'ENOMEM', syscall: 'mmap' }))
  })

  it('one write of 4 GiB + 1 MiB is split below the max message size and every byte lands in place', async () => {
    const maxMessage = device.queryPort(1).maxMessageSize
    expect(SIZE).toBeGreaterThan(maxMessage) // so the write must be split
    let t = Date.now()
    fillRange(a.region, 0, CHUNKS, 1)
    const fillMs = Date.now() - t
    t = Date.now()
    await a.qp.write(a.region.slice(0, SIZE), b.region.asRemote().slice(0, SIZE), { timeoutMs: TIMEOUT_MS })
    const writeMs = Date.now() - t
    t = Date.now()
    expect(firstBadChunk(b.region, 0, CHUNKS, () => 1)).toBe(-1)
    const checkMs = Date.now() - t
    console.log(`[25.large-memory] ${SIZE} bytes: fill ${fillMs} ms, write ${writeMs} ms (${(SIZE / MiB / (writeMs / 1000)).toFixed(1)} MiB/s), check ${checkMs} ms`)
  }, TIMEOUT_MS)

  it('postBatch splits a write over the max message size too', async () => {
    // Chunks [1 GiB, 3 GiB + 1 MiB) get a new seed and go in one batch op.
    const first = GiB / MiB
    const end = (3 * GiB + MiB) / MiB
    fillRange(a.region, first, end, 2)
    const length = (end - first) * MiB
    expect(length).toBeGreaterThan(device.queryPort(1).maxMessageSize)
    const t = Date.now()
    await a.qp.postBatch([
      { op: 'write', local: a.region.slice(first * MiB, length), remote: b.region.asRemote().slice(first * MiB, length) },
      { op: 'write', local: a.region.slice(SIZE - MiB, MiB), remote: b.region.asRemote().slice(0, MiB) },
    ], { timeoutMs: TIMEOUT_MS })
    console.log(`[25.large-memory] postBatch of ${length + MiB} bytes: ${Date.now() - t} ms`)
    expect(firstBadChunk(b.region, first, end, () => 2)).toBe(-1)
    expect(firstBadChunk(b.region, 1, first, () => 1)).toBe(-1) // untouched around it
    expect(firstBadChunk(b.region, end, CHUNKS, () => 1)).toBe(-1)
    const expected = new Uint8Array(MiB) // chunk 0 got a copy of the last chunk
    fillChunk(expected, CHUNKS - 1, 1)
    expect(Buffer.compare(b.region.slice(0, MiB).bytes, expected)).toBe(0)
  }, TIMEOUT_MS)

  it('a read across the 4 GiB boundary lands in place', async () => {
    const local = a.pd.allocRegion(2 * MiB, Access.LocalWrite)
    try {
      await a.qp.read(local.slice(), b.region.asRemote().slice(4 * GiB - MiB, 2 * MiB), { timeoutMs: 120_000 })
      const expected = new Uint8Array(MiB)
      fillChunk(expected, 4 * GiB / MiB - 1, 1)
      expect(Buffer.compare(local.slice(0, MiB).bytes, expected)).toBe(0)
      fillChunk(expected, 4 * GiB / MiB, 1)
      expect(Buffer.compare(local.slice(MiB, MiB).bytes, expected)).toBe(0)
    } finally {
      local.close()
    }
  }, TIMEOUT_MS)

  it('a send longer than the max message size is refused with ERR_MESSAGE_TOO_LARGE (a message cannot be split)', async () => {
    const maxMessage = device.queryPort(1).maxMessageSize
    await expect(a.qp.send(a.region.slice(0, maxMessage + 1))).rejects.toMatchObject({ code: 'ERR_MESSAGE_TOO_LARGE' })
    await expect(a.qp.postBatch([{ op: 'send', local: a.region.slice(0, maxMessage + 1) }])).rejects.toMatchObject({ code: 'ERR_MESSAGE_TOO_LARGE' })
    expect(a.qp.state).toBe('RTS')
    const received = b.qp.recv(b.region.slice(0, 64), { timeoutMs: 60_000 })
    await a.qp.send(a.region.slice(0, 64), { timeoutMs: 60_000 })
    expect((await received).byteLength).toBe(64)
  }, TIMEOUT_MS)
})
