// Memory registration is the security boundary: a peer reaches only what an
// rkey of the responder's own PD grants. Wrong-PD rkeys, invalidated window
// rkeys and random rkeys are refused, and no byte of any region changes.
// Also pins down an rxe quirk: a memory window's range is not checked.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { randomInt } from 'node:crypto'
import { Access, RemoteRegion, type Device, type MemoryRegion, type QueuePair } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, pattern, testDevice } from './helpers.js'

let device: Device
const cleanups: Array<() => void> = []
beforeAll(() => { device = testDevice() })
afterEach(() => { for (const c of cleanups.splice(0)) c() })
afterAll(() => device?.close())

const bounded = { timeoutMs: 30_000 }

async function pair(options: Parameters<typeof connectedPair>[1] = {}) {
  const p = await connectedPair(device, { size: 65536, ...options })
  cleanups.push(p.close)
  return p
}

/** Both QPs back to RTS after a refusal moved them to ERR (RESET, then connect again). */
async function reconnect(x: QueuePair, y: QueuePair): Promise<void> {
  x.modify('RESET')
  y.modify('RESET')
  await x.connect(y.endpoint())
  await y.connect(x.endpoint())
}

function filled(region: MemoryRegion, seed: number): Uint8Array {
  const bytes = pattern(region.length, seed)
  region.bytes.set(bytes)
  return bytes
}

describe('an rkey of PD A used through a QP of PD B', () => {
  it('is refused for write, read, compare-and-swap and fetch-and-add (REM_ACCESS_ERR); no byte changes', async () => {
    const { a, b } = await pair()
    // a.region is valid on this device, but in a's PD; the responder is b, in another PD.
    expect(a.pd).not.toBe(b.pd)
    const target = a.pd.allocRegion(65536, ALL_ACCESS)
    const original = filled(target, 115)
    const wrongPd = target.asRemote()
    a.region.bytes.set(pattern(4096, 7))
    const attempts: Array<[string, () => Promise<unknown>]> = [
      ['write', () => a.qp.write(a.region.slice(0, 4096), wrongPd.slice(0, 4096), bounded)],
      ['read', () => a.qp.read(a.region.slice(8192, 4096), wrongPd.slice(4096, 4096), bounded)],
      ['compareAndSwap', () => a.qp.compareAndSwap(wrongPd.slice(64, 8), 0n, 1n, bounded)],
      ['fetchAndAdd', () => a.qp.fetchAndAdd(wrongPd.slice(72, 8), 1n, bounded)],
    ]
    for (const [verb, attempt] of attempts) {
      await expect(attempt(), verb).rejects.toMatchObject({ name: 'RdmaError', status: 'REM_ACCESS_ERR' })
      await reconnect(a.qp, b.qp)
    }
    expect(Buffer.compare(target.bytes, original)).toBe(0)
    expect(a.region.bytes.subarray(8192, 12288).every((x) => x === 0)).toBe(true) // the read brought nothing
    // The same QP with an rkey of b's own PD works: the refusal was the PD.
    await a.qp.write(a.region.slice(0, 4096), b.region.asRemote().slice(0, 4096), bounded)
    expect(Buffer.compare(b.region.bytes.subarray(0, 4096), pattern(4096, 7))).toBe(0)
  })
})

describe('an invalidated memory window', () => {
  it('grants until it is invalidated; then its rkey is refused and the memory keeps its bytes', async () => {
    const { a, b } = await pair({ access: ALL_ACCESS | Access.MwBind })
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const grant = await b.qp.bindWindow(window, b.region.slice(4096, 4096), Access.RemoteWrite | Access.RemoteRead, bounded)
    const remote = new RemoteRegion(BigInt(grant.addr), grant.rkey, grant.length)
    a.region.bytes.set(pattern(4096, 1))
    await a.qp.write(a.region.slice(0, 4096), remote.slice(0, 4096), bounded)
    expect(Buffer.compare(b.region.bytes.subarray(4096, 8192), pattern(4096, 1))).toBe(0)

    await b.qp.invalidate(grant.rkey, bounded)
    a.region.bytes.set(pattern(4096, 2))
    await expect(a.qp.write(a.region.slice(0, 4096), remote.slice(0, 4096), bounded)).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
    await reconnect(a.qp, b.qp)
    await expect(a.qp.read(a.region.slice(8192, 64), remote.slice(0, 64), bounded)).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
    expect(Buffer.compare(b.region.bytes.subarray(4096, 8192), pattern(4096, 1))).toBe(0)
    expect(a.region.bytes.subarray(8192, 8256).every((x) => x === 0)).toBe(true)
  })
})

describe('10,000 random rkeys aimed at a peer', () => {
  it('are all dropped by the peer (UC: refused silently, the QP lives on); every region keeps its checksum', async () => {
    const { a, b } = await pair({ qp: { type: 'UC' } })
    const regions = [b.region, ...[1, 2, 3].map(() => b.pd.allocRegion(65536, ALL_ACCESS))]
    const originals = regions.map((region, i) => filled(region, 1000 + i))
    const valid = new Set(regions.map((r) => r.rkey))
    a.region.bytes.set(pattern(65536, 99))
    let sent = 0
    while (sent < 10_000) {
      const batch = []
      for (let i = 0; i < 200; i++) {
        let rkey: number
        do rkey = randomInt(0, 2 ** 32 - 1) >>> 0; while (valid.has(rkey))
        const target = regions[randomInt(regions.length)]
        const length = randomInt(1, 4097)
        const offset = randomInt(0, 65536 - length + 1)
        // Real addresses of the peer's regions: only the rkey stands in the way.
        const remote = new RemoteRegion(BigInt(target.address), rkey, target.length)
        batch.push({ op: 'write' as const, local: a.region.slice(offset, length), remote: remote.slice(offset, length) })
      }
      await a.qp.postBatch(batch, bounded)
      sent += batch.length
    }
    // A valid write after all of them arrives: the peer was alive and dropped each one.
    await a.qp.write(a.region.slice(0, 64), regions[0].asRemote().slice(0, 64), bounded)
    await waitFor(() => Buffer.compare(regions[0].bytes.subarray(0, 64), a.region.bytes.subarray(0, 64)) === 0)
    originals[0].set(a.region.bytes.subarray(0, 64), 0)
    regions.forEach((region, i) => expect(Buffer.compare(region.bytes, originals[i]), `region ${i}`).toBe(0))
  }, 300_000)

  it('over RC each one is refused with REM_ACCESS_ERR (100 of them: each kills the QPs, which are reconnected)', async () => {
    const { a, b } = await pair()
    const original = filled(b.region, 2000)
    a.region.bytes.set(pattern(65536, 98))
    for (let i = 0; i < 100; i++) {
      let rkey: number
      do rkey = randomInt(0, 2 ** 32 - 1) >>> 0; while (rkey === b.region.rkey)
      const remote = new RemoteRegion(BigInt(b.region.address), rkey, b.region.length)
      const length = randomInt(1, 4097)
      const op = i % 2 === 0
        ? a.qp.write(a.region.slice(0, length), remote.slice(0, length), bounded)
        : a.qp.fetchAndAdd(remote.slice(8 * randomInt(0, 8192), 8), 1n, bounded)
      await expect(op).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
      await reconnect(a.qp, b.qp)
    }
    expect(Buffer.compare(b.region.bytes, original)).toBe(0)
  }, 300_000)
})

describe('rxe quirk: a memory window is not range-checked', () => {
  it('a write through a window rkey lands outside the window (inside its region); outside the region it is refused', async () => {
    const { a, b } = await pair({ access: ALL_ACCESS | Access.MwBind })
    const window = b.pd.allocMemoryWindow(2)
    cleanups.unshift(() => window.close())
    const grant = await b.qp.bindWindow(window, b.region.slice(16384, 4096), Access.RemoteWrite, bounded)
    // The library refuses slices past a window's length; a hand-made descriptor claims more.
    const start = BigInt(b.region.address)
    const wide = new RemoteRegion(start, grant.rkey, b.region.length)
    a.region.bytes.set(pattern(128, 3))
    await a.qp.write(a.region.slice(0, 64), wide.slice(0, 64), bounded) // 16 KiB before the window
    await a.qp.write(a.region.slice(64, 64), wide.slice(40960, 64), bounded) // 20 KiB after it
    // On a device that checks the window (the IB spec), these writes fail and this test says so.
    expect(Buffer.compare(b.region.bytes.subarray(0, 64), pattern(128, 3).subarray(0, 64))).toBe(0)
    expect(Buffer.compare(b.region.bytes.subarray(40960, 41024), pattern(128, 3).subarray(64))).toBe(0)
    // The region's own bounds still hold.
    const past = new RemoteRegion(start, grant.rkey, b.region.length + 4096)
    await expect(a.qp.write(a.region.slice(0, 64), past.slice(b.region.length, 64), bounded)).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
  })
})

async function waitFor(condition: () => boolean, ms = 30_000): Promise<void> {
  const end = Date.now() + ms
  while (!condition()) {
    if (Date.now() > end) throw new Error(`not true after ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}
