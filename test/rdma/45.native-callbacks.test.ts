// Native lifetimes and loop callbacks: transactional newest-first close
// driven by return codes, async events delivered once per addon instance
// (worker threads) and safe against listeners that close, failures of CQs and
// watched fds that reject what waits on them, exceptions while building event
// objects, AsyncLocalStorage across completions, and pruned addon roots.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { AsyncLocalStorage } from 'node:async_hooks'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Worker } from 'node:worker_threads'
import { Access, type AsyncEvent, type Device } from '../../dist/index.js'
import { native } from '../../dist/native/addon.js'
import { internals } from '../internals.js'
import { ALL_ACCESS, connectedPair, srqPair, testDevice, within } from './helpers.js'

const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url))

let device: Device
beforeAll(() => { device = testDevice() })
afterAll(() => device?.close())

function nextEvent(on: Device, type: string, timeoutMs = 20_000): Promise<AsyncEvent> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { on.off('async', listener); reject(new Error(`no ${type} event within ${timeoutMs} ms`)) }, timeoutMs)
    const listener = (event: AsyncEvent) => {
      if (event.type !== type) return
      clearTimeout(timer)
      on.off('async', listener)
      resolve(event)
    }
    on.on('async', listener)
  })
}

/**
 * Drives one SRQ_LIMIT_REACHED: posts 4 receives, arms the SRQ 2 below what it
 * holds, and consumes 3 of them (one stays posted for the next round).
 */
async function provokeSrqLimit(pair: Awaited<ReturnType<typeof srqPair>>, leftover: number): Promise<void> {
  const receives = Array.from({ length: 4 }, (_, i) => pair.srq.recv(pair.region.slice(i * 64, 64)))
  for (const receive of receives) receive.catch(() => {}) // the last one is still posted when the SRQ closes
  pair.srq.arm(leftover + 4 - 2)
  for (let i = 0; i < 3; i++) await pair.sender.send(pair.region.slice(1024, 8))
}

describe('close: newest first and regions last, transactional, driven by return codes', () => {
  // rxe refuses ibv_dereg_mr (EINVAL) while a memory window is bound to the region.
  async function boundWindow(windowFirst: boolean) {
    const pair = await connectedPair(device, { access: ALL_ACCESS | Access.MwBind })
    const { pd, qp } = pair.b
    const window = windowFirst ? pd.allocMemoryWindow(1) : undefined
    const region = pd.allocRegion(8192, ALL_ACCESS | Access.MwBind)
    const mw = window ?? pd.allocMemoryWindow(1)
    await qp.bindWindow(mw, region.slice(0, 4096), Access.RemoteWrite)
    return { pair, pd, region, mw }
  }

  it('natively, a PD closes its children newest first: a window bound to an older region closes before it', async () => {
    const { pair, pd } = await boundWindow(false)
    try {
      internals(pd).handle.close() // the native close, which the environment cleanup hook also uses
      expect(() => internals(pd).handle.handle).toThrow(/closed/)
    } finally {
      pair.close()
    }
  })

  it('natively, regions close after their siblings, as in JS: a region newer than the window bound to it still closes after the window', async () => {
    // Newest first alone would deregister the region first, which rxe refuses (EINVAL) while a window is bound to it.
    const { pair, pd } = await boundWindow(true)
    try {
      internals(pd).handle.close() // the native close, which the environment cleanup hook also uses
      expect(() => internals(pd).handle.handle).toThrow(/closed/)
    } finally {
      pair.close()
    }
  })

  it('natively, a handle that refuses to close stays open and usable, and so does its parent', async () => {
    const { pair, pd, region, mw } = await boundWindow(true)
    try {
      let error: (Error & { code?: string; syscall?: string }) | undefined
      try { internals(region).handle.close() } catch (e) { error = e as Error }
      expect(error).toMatchObject({ code: 'EINVAL', syscall: 'ibv_dereg_mr' })
      expect(internals(pd).handle.handle).toBeGreaterThan(0) // still open
      expect(internals(region).handle.info().rkey).toBe(region.rkey)
      expect(internals(mw).handle.rkey).toBeGreaterThan(0)
      // The region still works: a write through it lands.
      pair.a.region.bytes.fill(0x5a, 0, 64)
      await pair.a.qp.write(pair.a.region.slice(0, 64), region.asRemote().slice(4096, 64))
      expect(region.bytes[4096]).toBe(0x5a)
      mw.close()
      internals(pd).handle.close()
      expect(() => internals(pd).handle.handle).toThrow(/closed/)
    } finally {
      pair.close()
    }
  })

  it('a JS close() that the device refuses leaves the object open and usable, and can be retried', async () => {
    const { pair, region, mw } = await boundWindow(false)
    try {
      expect(() => region.close()).toThrow(expect.objectContaining({ code: 'EINVAL', syscall: 'ibv_dereg_mr' }))
      expect(region.closed).toBe(false)
      pair.a.region.bytes.fill(0x6b, 0, 64)
      await pair.a.qp.write(pair.a.region.slice(0, 64), region.asRemote().slice(0, 64))
      expect(region.bytes[0]).toBe(0x6b)
      mw.close()
      region.close()
      expect(region.closed).toBe(true)
    } finally {
      pair.close()
    }
  })
})

describe('device async events', () => {
  it("an 'async' listener that closes its Device: the process goes on, later events reach the other Device only", async () => {
    const closing = testDevice()
    const pair = await srqPair(device)
    try {
      let seenByClosed = 0
      closing.on('async', (event) => {
        if (event.type !== 'SRQ_LIMIT_REACHED') return
        seenByClosed++
        closing.close()
      })
      for (let round = 0; round < 3; round++) {
        const event = nextEvent(device, 'SRQ_LIMIT_REACHED')
        await provokeSrqLimit(pair, round)
        expect((await event).srq).toBe(pair.srq)
      }
      expect(closing.closed).toBe(true)
      expect(seenByClosed).toBe(1)
    } finally {
      pair.close()
      closing.close()
    }
  })

  it('each addon instance gets every event: SRQ_LIMIT_REACHED reaches the main thread every time while a worker watches too', async () => {
    const worker = new Worker(fixture('async-events-worker.mjs'))
    const seenByWorker: string[] = []
    const pair = await srqPair(device)
    try {
      await within(new Promise<void>((resolve, reject) => {
        worker.on('message', (m: { type: string }) => { if (m.type === 'ready') resolve(); else seenByWorker.push(m.type) })
        worker.once('error', reject)
      }), 30_000)
      const rounds = 5
      for (let round = 0; round < rounds; round++) {
        const event = nextEvent(device, 'SRQ_LIMIT_REACHED')
        await provokeSrqLimit(pair, round)
        expect((await event).srq).toBe(pair.srq)
      }
      // The worker sees them too (as events of a device it has no SRQ of).
      await within((async () => { while (seenByWorker.filter((t) => t === 'SRQ_LIMIT_REACHED').length < rounds) await new Promise((r) => setTimeout(r, 50)) })(), 20_000)
    } finally {
      pair.close()
      worker.postMessage('exit')
      await within(new Promise((resolve) => worker.once('exit', resolve)), 30_000)
    }
  })
})

describe('failures reject what waits', () => {
  it('CQ_ERR rejects the requests waiting on that CQ with a coded error and emits error on the device', async () => {
    const { a, b, close } = await connectedPair(device)
    const errors: Error[] = []
    const onError = (e: Error) => errors.push(e)
    device.on('error', onError)
    try {
      const received = b.qp.recv(b.region.slice(0, 64))
      // What the addon delivers for IBV_EVENT_CQ_ERR (0) on this CQ (rxe reports an overrun so).
      internals(device).onAsyncEvent(0, internals(b.cq).kernelHandle)
      await expect(within(received)).rejects.toMatchObject({ name: 'RdmaError', code: 'CQ_ERR' })
      expect(errors).toHaveLength(1)
      expect(errors[0]).toMatchObject({ code: 'CQ_ERR' })
      await expect(b.qp.send(b.region.slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
      await a.qp.write(a.region.slice(0, 8), b.region.asRemote().slice(0, 8)) // the other CQ is unaffected
    } finally {
      device.off('error', onError)
      close()
    }
  })

  it('DEVICE_FATAL rejects every request waiting on the device', async () => {
    const other = testDevice()
    const pair = await connectedPair(other)
    try {
      const first = pair.a.qp.recv(pair.a.region.slice(0, 64))
      const second = pair.b.qp.recv(pair.b.region.slice(0, 64))
      internals(other).onAsyncEvent(8, 0)
      await expect(within(first)).rejects.toMatchObject({ code: 'DEVICE_FATAL' })
      await expect(within(second)).rejects.toMatchObject({ code: 'DEVICE_FATAL' })
    } finally {
      pair.close()
      other.close()
    }
  })

  // rxe has no disassociate_ucontext: 'rdma link delete' blocks until the
  // process closes the device, so the fd error of a removed device cannot be
  // provoked with Soft-RoCE; the hook runs the same handler libuv does.
  it('an error status on the completion channel fd rejects what waits with EIO and emits error, and stops watching', async () => {
    const { b, close } = await connectedPair(device)
    const errors: Error[] = []
    const onError = (e: Error) => errors.push(e)
    device.on('error', onError)
    try {
      const received = b.qp.recv(b.region.slice(0, 64))
      internals(b.cq).handle.simulateFdError()
      await expect(within(received)).rejects.toMatchObject({ code: 'EIO', errno: 5, syscall: 'ibv_get_cq_event' })
      expect(errors[0]).toMatchObject({ code: 'EIO', syscall: 'ibv_get_cq_event' })
      expect(b.cq.error).toBe(errors[0])
    } finally {
      device.off('error', onError)
      close()
    }
  })
})

describe('loop callbacks', () => {
  it('an exception while building a CM event object is reported as uncaught, the event is acked, and the process goes on', () => {
    const child = spawnSync(process.execPath, [fixture('cm-event-throws.mjs')], { encoding: 'utf8', timeout: 120_000 })
    expect(child.signal, child.stderr).toBeNull()
    expect(child.status, child.stderr).toBe(0)
    const result = JSON.parse(child.stdout.trim().split('\n').pop()!)
    expect(result.uncaught).toContain('boom')
    expect(result.first).toBe('ETIMEDOUT')
    expect(result.second).toBe('connected')
  })

  it('AsyncLocalStorage survives a completion', async () => {
    const { a, b, close } = await connectedPair(device)
    try {
      const als = new AsyncLocalStorage<string>()
      const seen = await als.run('request-42', async () => {
        const received = b.qp.recv(b.region.slice(0, 64))
        await a.qp.send(a.region.slice(0, 64))
        await received
        return als.getStore()
      })
      expect(seen).toBe('request-42')
    } finally {
      close()
    }
  })

  it('closed devices do not accumulate in the addon roots', () => {
    const before = native.rootCount()
    for (let i = 0; i < 20; i++) testDevice().close()
    expect(native.rootCount()).toBeLessThanOrEqual(before + 1)
  })
})

