// Error completions and refused requests: each gives a typed error, and a QP
// in the error state rejects later requests at once instead of hanging.
import { afterEach, beforeAll, afterAll, describe, expect, it } from 'vitest'
import { Access, RdmaError, RemoteRegion, type Device } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair } from './helpers.js'
import { testDevice } from './helpers.js'

let device: Device
const cleanups: Array<() => void> = []
beforeAll(() => { device = testDevice() })
afterEach(() => { while (cleanups.length) cleanups.pop()!() })
afterAll(() => device?.close())

async function pair(options: Parameters<typeof connectedPair>[1] = {}) {
  const p = await connectedPair(device, { size: 65536, ...options })
  cleanups.push(p.close)
  return p
}

/** After an error completion, the QP rejects new requests at once. */
async function expectQpFailed(qp: Awaited<ReturnType<typeof pair>>['a']['qp'], local: Awaited<ReturnType<typeof pair>>['a']['region']) {
  expect(qp.state).toBe('ERR')
  await expect(qp.write(local.slice(0, 8), local.asRemote().slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
  await expect(qp.recv(local.slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
}

describe('remote access errors', () => {
  it('a wrong rkey gives REM_ACCESS_ERR', async () => {
    const { a, b } = await pair()
    const wrong = new RemoteRegion(b.region.asRemote().addr, (b.region.rkey ^ 0x5a5a00) >>> 0, 65536)
    const error = await a.qp.write(a.region.slice(0, 64), wrong.slice(0, 64)).catch((e) => e)
    expect(error).toBeInstanceOf(RdmaError)
    expect(error).toMatchObject({ code: 'REM_ACCESS_ERR', status: 'REM_ACCESS_ERR', verb: 'write', qpn: a.qp.qpn })
    expect(typeof error.wrId).toBe('number')
    await expectQpFailed(a.qp, a.region)
  })

  it('the rkey of a deregistered region gives REM_ACCESS_ERR', async () => {
    const { a, b } = await pair()
    const extra = b.pd.allocRegion(4096, ALL_ACCESS)
    const remote = extra.asRemote()
    extra.deregister()
    await expect(a.qp.write(a.region.slice(0, 64), remote.slice(0, 64))).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
  })

  it.each([
    ['write', Access.LocalWrite | Access.RemoteRead | Access.RemoteAtomic],
    ['read', Access.LocalWrite | Access.RemoteWrite | Access.RemoteAtomic],
    ['fetchAndAdd', Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead],
  ] as const)('%s into a region registered without that remote access is refused by the peer', async (verb, access) => {
    const { a, b } = await pair()
    const limited = b.pd.allocRegion(4096, access)
    limited.bytes.fill(0x11)
    const remote = limited.asRemote()
    const op = verb === 'write' ? a.qp.write(a.region.slice(0, 8), remote.slice(0, 8))
      : verb === 'read' ? a.qp.read(a.region.slice(0, 8), remote.slice(0, 8))
        : a.qp.fetchAndAdd(remote.slice(0, 8), 1n)
    await expect(op).rejects.toMatchObject({ status: 'REM_ACCESS_ERR', verb })
    expect([...limited.bytes.subarray(0, 8)].every((x) => x === 0x11)).toBe(true)
    await expectQpFailed(a.qp, a.region)
  })

  it('an unaligned atomic is refused by the device, and the QP stays usable', async () => {
    const { a, b } = await pair()
    const error = await a.qp.fetchAndAdd(b.region.asRemote().slice(3, 8), 1n).catch((e) => e)
    // rxe refuses it when it is posted (ibv_post_send: EINVAL), before any packet.
    expect(error).toBeInstanceOf(RdmaError)
    expect(error).toMatchObject({ code: 'EINVAL', syscall: 'ibv_post_send' })
    expect(await a.qp.fetchAndAdd(b.region.asRemote().slice(8, 8), 1n)).toBe(0n)
  })

  it('requests posted together in one turn: a refused one fails alone, the others complete', async () => {
    const { a, b } = await pair()
    a.region.bytes.fill(0x61, 0, 64)
    const remote = b.region.asRemote()
    const first = a.qp.write(a.region.slice(0, 64), remote.slice(0, 64))
    const unaligned = a.qp.fetchAndAdd(remote.slice(1001, 8), 1n)
    const last = a.qp.write(a.region.slice(0, 64), remote.slice(128, 64))
    await expect(unaligned).rejects.toMatchObject({ code: 'EINVAL', syscall: 'ibv_post_send' })
    await first
    await last
    expect(b.region.bytes[0]).toBe(0x61)
    expect(b.region.bytes[128 + 63]).toBe(0x61)
    expect(a.qp.state).toBe('RTS')
  })

  it('a remote slice past the region end is caught locally, before posting', async () => {
    const { b } = await pair()
    expect(() => b.region.asRemote().slice(65530, 8)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(() => b.region.slice(0, 65537)).toThrow(RangeError)
  })

  it('WRITE with local and remote lengths that differ is refused (no silent partial write)', async () => {
    const { a, b } = await pair()
    await expect(a.qp.write(a.region.slice(0, 16), b.region.asRemote().slice(0, 8))).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    expect(a.qp.state).toBe('RTS')
  })

  it('an invalidated memory window no longer grants access', async () => {
    const { a, b } = await pair({ access: ALL_ACCESS | Access.MwBind })
    const window = b.pd.allocMemoryWindow(2)
    const granted = await b.qp.bindWindow(window, b.region.slice(4096, 4096), Access.RemoteWrite | Access.RemoteRead)
    expect(granted.length).toBe(4096)
    a.region.bytes.fill(0x42, 0, 16)
    const remote = new RemoteRegion(BigInt(granted.addr), granted.rkey, granted.length)
    await a.qp.write(a.region.slice(0, 16), remote.slice(0, 16))
    expect([...b.region.bytes.subarray(4096, 4112)].every((x) => x === 0x42)).toBe(true)
    await b.qp.invalidate(granted.rkey)
    await expect(a.qp.write(a.region.slice(0, 16), remote.slice(16, 16))).rejects.toMatchObject({ status: 'REM_ACCESS_ERR' })
    expect(b.region.bytes[4096 + 16]).toBe(0)
  })
})

describe('local errors', () => {
  it('posting on a QP that is not connected is refused with ERR_QP_STATE', async () => {
    const pd = device.allocPd()
    const cq = device.createCq()
    cleanups.push(() => { pd.close(); cq.close() })
    const qp = pd.createQp({ type: 'RC', sendCq: cq })
    const region = pd.allocRegion(4096, Access.LocalWrite)
    expect(qp.state).toBe('RESET')
    expect(qp.query().state).toBe('RESET')
    await expect(qp.send(region.slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
    await expect(qp.recv(region.slice(0, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE' })
  })

  it('a send with no receive posted (RQ overflow) ends in RNR_RETRY_EXC_ERR, not a hang', async () => {
    const { a } = await pair({ connect: { rnrRetry: 0, minRnrTimer: 1 } })
    const error = await a.qp.send(a.region.slice(0, 8)).catch((e) => e)
    expect(error).toMatchObject({ status: 'RNR_RETRY_EXC_ERR', verb: 'send' })
    await expectQpFailed(a.qp, a.region)
  })

  it('more SGEs than the QP allows is refused before posting', async () => {
    const { a, b } = await pair()
    const slices = [a.region.slice(0, 8), a.region.slice(8, 8)] // maxSendSge defaults to 1
    await expect(a.qp.send(slices)).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    await expect(b.qp.recv(slices)).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    expect(a.qp.state).toBe('RTS')
  })

  it('registering REMOTE_WRITE without LOCAL_WRITE is refused', () => {
    const pd = device.allocPd()
    cleanups.push(() => pd.close())
    expect(() => pd.allocRegion(4096, Access.RemoteWrite)).toThrow(expect.objectContaining({ code: 'EINVAL', syscall: 'ibv_reg_mr' }))
    expect(() => pd.allocRegion(4096, Access.RemoteAtomic)).toThrow(RdmaError)
  })

  it('a dead peer gives RETRY_EXC_ERR within the bound its timeout and retry count set', async () => {
    const timeout = 8
    const retryCount = 1
    const { a, b } = await pair({ connect: { timeout, retryCount } })
    // Each try waits 4.096 us * 2^timeout; the spec lets a device wait up to 4x that, and
    // the kernel rounds up to a timer tick (<= 10 ms). Slack for a loaded emulated guest.
    const perTryMs = Math.max(4 * 4.096e-3 * 2 ** timeout, 10)
    const slackMs = 10_000
    const boundMs = (retryCount + 1) * perTryMs + slackMs
    b.qp.close()
    const started = performance.now()
    const error = await a.qp.write(a.region.slice(0, 8), b.region.asRemote().slice(0, 8), { timeoutMs: 2 * boundMs }).catch((e) => e)
    const elapsedMs = performance.now() - started
    expect(error).toMatchObject({ status: 'RETRY_EXC_ERR' })
    expect(elapsedMs, `dead peer detected after ${Math.round(elapsedMs)} ms`).toBeLessThan(boundMs)
    console.log(`dead peer detected after ${Math.round(elapsedMs)} ms (bound ${Math.round(boundMs)} ms)`)
  })

  it('a receive nobody sends to can time out or be aborted', async () => {
    const { b } = await pair()
    await expect(b.qp.recv(b.region.slice(0, 8), { timeoutMs: 50 })).rejects.toMatchObject({ code: 'ETIMEDOUT', verb: 'recv' })
    const controller = new AbortController()
    const waiting = b.qp.recv(b.region.slice(0, 8), { signal: controller.signal })
    controller.abort()
    await expect(waiting).rejects.toMatchObject({ code: 'ABORT_ERR' })
    // The aborted receives are still posted: the region stays busy until the QP is done with them.
    expect(b.region.inflight).toBeGreaterThan(0)
    expect(() => b.region.deregister()).toThrow(expect.objectContaining({ code: 'ERR_BUSY' }))
    await expect(b.region.deregisterWhenIdle({ timeoutMs: 50 })).rejects.toMatchObject({ code: 'ETIMEDOUT' })
    expect(b.region.closed).toBe(false)
    const idle = b.region.deregisterWhenIdle()
    b.qp.close() // the device is done with the posted receives
    await idle
    expect(b.region.inflight).toBe(0)
    expect(b.region.closed).toBe(true)
  })

  it('bad arguments give typed errors, not crashes', async () => {
    const { a, b } = await pair()
    await expect(a.qp.write({} as never, b.region.asRemote().slice(0, 8))).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    await expect(a.qp.write(a.region.slice(0, 8), { addr: 1, rkey: 2 } as never)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    await expect(a.qp.fetchAndAdd(b.region.asRemote().slice(0, 8), 1 as never)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    await expect(a.qp.send(a.region.slice(0, 8), { immediate: -1 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
    await expect(a.qp.postBatch([])).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    expect(() => a.pd.createQp({ sendCq: a.pd } as never)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(() => a.pd.registerMemory('text' as never)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(() => device.createCq({ entries: 0 })).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(a.qp.state).toBe('RTS')
  })
})
