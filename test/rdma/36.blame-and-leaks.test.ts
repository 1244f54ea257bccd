// The right request is blamed, nothing is lost silently, nothing leaks:
// closed address handles in a gathered batch, receives that timed out, the
// atomic scratch slot of a refused request, regions of another PD.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { Access, type Device } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, pattern, srqPair, testDevice } from './helpers.js'
import { countResources } from './resources.js'

let device: Device
const cleanups: Array<() => void> = []
beforeAll(() => { device = testDevice() })
afterEach(() => { while (cleanups.length) cleanups.pop()!() })
afterAll(() => device?.close())

async function pair() {
  const p = await connectedPair(device, { size: 65536 })
  cleanups.push(p.close)
  return p
}

async function until(condition: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms
  while (!condition()) {
    if (Date.now() > end) throw new Error(`${what}: not true after ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

describe('a closed address handle in a batch of UD sends', () => {
  it('fails only its own send; the sends before it are posted and arrive', async () => {
    const pd = device.allocPd()
    const cq = device.createCq()
    const region = pd.allocRegion(65536, Access.LocalWrite)
    const server = pd.createQp({ type: 'UD', sendCq: cq })
    const client = pd.createQp({ type: 'UD', sendCq: cq })
    cleanups.push(() => { pd.close(); cq.close() })
    const qkey = 0x1234
    await server.activate({ qkey })
    await client.activate({ qkey })
    const ep = server.endpoint()
    const ah = pd.createAddressHandle({ gid: ep.gid, lid: ep.lid })
    const closedAh = pd.createAddressHandle({ gid: ep.gid, lid: ep.lid })
    closedAh.close()
    const received = [0, 1].map((i) => server.recv(region.slice(i * 1024, 40 + 256), { timeoutMs: 10_000 }))
    region.bytes.set(pattern(256, 1), 8192)
    region.bytes.set(pattern(256, 2), 8192 + 256)
    const dest = { ah, qpn: server.qpn, qkey }
    // One turn: a is posted at once, b and c are gathered and posted together.
    const a = client.send(region.slice(8192, 256), { dest, timeoutMs: 10_000 })
    const b = client.send(region.slice(8192 + 256, 256), { dest, timeoutMs: 10_000 })
    const c = client.send(region.slice(8192, 256), { dest: { ...dest, ah: closedAh }, timeoutMs: 10_000 })
    const [ra, rb, rc] = await Promise.allSettled([a, b, c])
    expect(rc).toMatchObject({ status: 'rejected', reason: { code: 'ERR_CLOSED' } })
    expect([ra.status, rb.status]).toEqual(['fulfilled', 'fulfilled'])
    const wcs = await Promise.all(received)
    expect(wcs.map((wc) => wc.byteLength)).toEqual([296, 296])
    expect(Buffer.compare(region.bytes.subarray(40, 296), pattern(256, 1))).toBe(0)
    expect(Buffer.compare(region.bytes.subarray(1024 + 40, 1024 + 296), pattern(256, 2))).toBe(0)
  })
})

describe('a receive that timed out', () => {
  it('takes the next message: counted in orphanedReceives, the bytes are in its buffer', async () => {
    const { a, b } = await pair()
    await expect(b.qp.recv(b.region.slice(0, 256), { timeoutMs: 50 })).rejects.toMatchObject({ code: 'ETIMEDOUT' })
    expect(b.qp.orphanedReceives).toBe(0)
    const next = b.qp.recv(b.region.slice(1024, 256), { timeoutMs: 10_000 })
    a.region.bytes.set(pattern(256, 5), 0)
    a.region.bytes.set(pattern(256, 6), 256)
    await a.qp.send(a.region.slice(0, 256), { timeoutMs: 10_000 })
    await until(() => b.qp.orphanedReceives === 1, 'orphanedReceives === 1')
    expect(Buffer.compare(b.region.bytes.subarray(0, 256), pattern(256, 5))).toBe(0) // landed in the timed-out buffer
    await a.qp.send(a.region.slice(256, 256), { timeoutMs: 10_000 })
    expect(await next).toMatchObject({ byteLength: 256 })
    expect(Buffer.compare(b.region.bytes.subarray(1024, 1280), pattern(256, 6))).toBe(0)
    expect(b.qp.orphanedReceives).toBe(1)
  })

  it('on an SRQ too', async () => {
    const { srq, region, sender, close } = await srqPair(device, 8192)
    cleanups.push(close)
    await expect(srq.recv(region.slice(0, 64), { timeoutMs: 50 })).rejects.toMatchObject({ code: 'ETIMEDOUT' })
    region.bytes.set(pattern(64, 8), 4096)
    await sender.send(region.slice(4096, 64), { timeoutMs: 10_000 })
    await until(() => srq.orphanedReceives === 1, 'srq.orphanedReceives === 1')
    expect(Buffer.compare(region.bytes.subarray(0, 64), pattern(64, 8))).toBe(0)
  })
})

describe('the atomic scratch slot', () => {
  it('is given back when the request is refused before it is posted', async () => {
    const pd = device.allocPd()
    const cq = device.createCq()
    const qp = pd.createQp({ type: 'RC', sendCq: cq }) // RESET: every atomic is refused
    const target = pd.allocRegion(4096, ALL_ACCESS)
    cleanups.push(() => { pd.close(); cq.close() })
    const before = countResources('mr')
    // One scratch page holds 512 slots: leaking each would register a second page.
    for (let i = 0; i < 600; i++) {
      await expect(qp.fetchAndAdd(target.asRemote().slice(0, 8), 1n)).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
    }
    expect(countResources('mr') - before).toBe(1)
  })
})

describe('regions of another protection domain', () => {
  it('are refused with ERR_WRONG_PD, and the QP stays usable', async () => {
    const { a, b } = await pair()
    const otherPd = device.allocPd()
    cleanups.push(() => otherPd.close())
    const other = otherPd.allocRegion(4096, ALL_ACCESS)
    const remote = b.region.asRemote()
    const bounded = { timeoutMs: 5000 } // before the check, some of these waited for a completion that never came
    await expect(a.qp.write(other.slice(0, 8), remote.slice(0, 8), bounded)).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    await expect(a.qp.read(other.slice(0, 8), remote.slice(0, 8), bounded)).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    await expect(a.qp.send(other.slice(0, 8), bounded)).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    await expect(a.qp.recv(other.slice(0, 8), bounded)).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    await expect(a.qp.fetchAndAdd(remote.slice(0, 8), 1n, { local: other.slice(0, 8), ...bounded })).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    await expect(a.qp.postBatch([{ op: 'write', local: other.slice(0, 8), remote: remote.slice(0, 8) }], bounded)).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    const srq = otherPd.createSrq()
    await expect(srq.recv(a.region.slice(0, 8), bounded)).rejects.toMatchObject({ code: 'ERR_WRONG_PD' })
    expect(a.qp.state).toBe('RTS')
    a.region.bytes.set(pattern(8, 4), 0)
    await a.qp.write(a.region.slice(0, 8), remote.slice(0, 8), { timeoutMs: 10_000 })
    expect(Buffer.compare(b.region.bytes.subarray(0, 8), pattern(8, 4))).toBe(0)
  })
})
