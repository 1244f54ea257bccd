// Lifetimes: close in any order, double close, use after close, garbage
// collection, worker threads, and process exit with live objects.
import { describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { Worker } from 'node:worker_threads'
import { fileURLToPath } from 'node:url'
import { Access, RdmaError } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, pattern, testDevice, waitWithoutLoop } from './helpers.js'

const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url))

function everything() {
  const device = testDevice()
  const pd = device.allocPd()
  const cq = device.createCq()
  const srq = pd.createSrq()
  const qp = pd.createQp({ type: 'RC', sendCq: cq })
  const srqQp = pd.createQp({ type: 'RC', sendCq: cq, srq })
  const region = pd.allocRegion(4096, ALL_ACCESS | Access.MwBind)
  const window = pd.allocMemoryWindow(2)
  const ah = pd.createAddressHandle({ gid: device.gids(1).find((g) => g.index === device.defaultGidIndex(1))!.gid })
  return { device, pd, cq, srq, qp, srqQp, region, window, ah }
}

describe('closing', () => {
  it('closing the device closes everything under it, children first', () => {
    const all = everything()
    all.device.close()
    for (const [name, object] of Object.entries(all)) expect(object.closed, name).toBe(true)
  })

  it.each([
    ['qp', 'srqQp', 'srq', 'cq', 'window', 'ah', 'region', 'pd', 'device'],
    ['region', 'window', 'ah', 'srq', 'pd', 'cq', 'qp', 'device', 'srqQp'],
    ['cq', 'pd', 'device'],
    ['pd', 'cq', 'device'],
  ])('closes in the order %s, ... and every close is idempotent', (...order) => {
    const all = everything() as Record<string, { close(): void; closed: boolean }>
    for (const name of order) {
      all[name]!.close()
      all[name]!.close()
      expect(all[name]!.closed).toBe(true)
    }
    for (const [name, object] of Object.entries(all)) {
      object.close()
      expect(object.closed, name).toBe(true)
    }
  })

  it('closing a CQ closes the QPs that use it', () => {
    const all = everything()
    all.cq.close()
    expect(all.qp.closed).toBe(true)
    expect(all.srqQp.closed).toBe(true)
    expect(all.pd.closed).toBe(false)
    all.device.close()
  })

  it('use after close gives ERR_CLOSED', async () => {
    const all = everything()
    const remote = all.region.asRemote()
    const local = all.region.slice(0, 8)
    all.device.close()
    await expect(all.qp.write(local, remote.slice(0, 8))).rejects.toMatchObject({ code: 'ERR_CLOSED' })
    expect(() => all.region.slice(0, 8)).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }))
    expect(() => all.pd.allocRegion(8)).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }))
    expect(() => all.device.allocPd()).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }))
    expect(() => all.device.queryPort(1)).toThrow(RdmaError)
    expect(() => all.cq.poll()).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }))
    await expect(all.qp.connect(all.srqQp.endpoint as never)).rejects.toMatchObject({ code: 'ERR_CLOSED' })
  })

  it('Symbol.dispose closes (using declarations)', () => {
    const device = testDevice()
    let seen: { pd: { closed: boolean }; region: { closed: boolean } } | undefined
    {
      using pd = device.allocPd()
      using region = pd.allocRegion(64)
      expect(region.closed).toBe(false)
      seen = { pd, region }
    }
    expect(seen.region.closed).toBe(true)
    expect(seen.pd.closed).toBe(true)
    expect(device.closed).toBe(false)
    device.close()
    expect(device.closed).toBe(true)
  })

  it('closing a QP with requests in flight rejects them and frees their regions', async () => {
    const device = testDevice()
    const { a, b, close } = await connectedPair(device)
    const receives = Array.from({ length: 10 }, () => b.qp.recv(b.region.slice(0, 64)))
    expect(b.region.inflight).toBe(10)
    expect(() => b.region.deregister()).toThrow(expect.objectContaining({ code: 'ERR_BUSY' }))
    b.qp.close()
    for (const r of receives) await expect(r).rejects.toMatchObject({ code: 'ERR_CLOSED' })
    expect(b.region.inflight).toBe(0)
    b.region.deregister()
    void a
    close()
    device.close()
  })

  it('closing a QP delivers what the device completed before it: a message that arrived is received, then the rest is rejected', async () => {
    const device = testDevice()
    const { a, b, close } = await connectedPair(device)
    try {
      const data = pattern(64, 40)
      a.region.bytes.set(data)
      const arrived = b.qp.recv(b.region.slice(0, 64))
      const later = b.qp.recv(b.region.slice(64, 64))
      const sent = a.qp.send(a.region.slice(0, 64)) // the first send of a turn is posted at once
      // Without turning the event loop (b's CQ event cannot deliver the
      // message), wait for the SEND's acknowledgement: the responder
      // completes the receive before it acknowledges, so the message's
      // completion now sits in b's CQ, as when rdma_cm reports the peer's
      // disconnect before the CQ's event is handled.
      waitWithoutLoop(() => { a.cq.poll(); return a.cq.pending === 0 }, 10_000)
      expect(b.cq.pending, 'the receives are still undelivered').toBe(2)
      b.qp.close()
      await sent
      const wc = await arrived
      expect(wc.byteLength).toBe(64)
      expect(Buffer.compare(b.region.bytes.subarray(0, 64), data)).toBe(0)
      await expect(later).rejects.toMatchObject({ code: 'ERR_CLOSED' })
    } finally {
      close()
      device.close()
    }
  })
})

describe('garbage collection and processes', () => {
  it('unreferenced objects are collected', async () => {
    const gc = (globalThis as { gc?: () => void }).gc
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const device = testDevice()
    const refs = (() => {
      const pd = device.allocPd()
      const cq = device.createCq()
      const qp = pd.createQp({ type: 'RC', sendCq: cq })
      const region = pd.allocRegion(1 << 20, Access.LocalWrite)
      return [pd, cq, qp, region].map((o) => new WeakRef(o))
    })()
    for (let i = 0; i < 20 && refs.some((r) => r.deref() !== undefined); i++) {
      await new Promise((resolve) => setImmediate(resolve))
      gc!()
    }
    expect(refs.map((r) => r.deref() === undefined)).toEqual([true, true, true, true])
    // The device still works after its children were finalized.
    const pd = device.allocPd()
    pd.allocRegion(4096)
    device.close()
  })

  it('a worker thread uses the API and exits without closing', async () => {
    const worker = new Worker(fixture('worker.mjs'))
    const message = await new Promise<{ ok: boolean }>((resolve, reject) => {
      worker.once('message', resolve)
      worker.once('error', reject)
    })
    expect(message.ok).toBe(true)
    const code = await new Promise((resolve) => worker.once('exit', resolve))
    expect(code).toBe(0)
  })

  it.each(['idle', 'inflight'])('a child process exits cleanly with live objects (%s)', (mode) => {
    const child = spawnSync(process.execPath, [fixture('exit-with-live-objects.mjs'), mode], { encoding: 'utf8', timeout: 120_000 })
    expect(child.stderr).toBe('')
    expect(child.signal).toBeNull()
    expect(child.status).toBe(0)
    expect(child.stdout).toMatch(mode === 'idle' ? /returning with live objects/ : /exiting with requests in flight/)
  })
})
