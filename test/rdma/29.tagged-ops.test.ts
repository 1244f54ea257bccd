// The lower-level completion path: qp.postWrite()/postRead() with a numeric
// tag, each reported once to the QP's completion handler, never from inside
// the call that posted it; bad input and full queues throw at once, coded;
// closing reports what is left; regions stay held while the device uses them.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { RemoteRegion, type Device, type RdmaError } from '../../dist/index.js'
import { connectedPair, pattern, setU64, testDevice, u64, within, type Side } from './helpers.js'

let device: Device
const pairs: Array<() => void> = []
afterAll(() => {
  for (const close of pairs) close()
  device?.close()
})
beforeAll(() => { device = testDevice() })

async function pair(pollMode: 'event' | 'busy' = 'busy'): Promise<{ a: Side; b: Side }> {
  const { a, b, close } = await connectedPair(device, { size: 1 << 16, pollMode })
  pairs.push(close)
  return { a, b }
}

/** Records each report; `posting` is true while a post call runs (a report then is a defect). */
function recorder(side: Side) {
  const reports = new Map<number, Array<string | undefined>>()
  const state = { posting: false, duringPost: 0 }
  let wake: (() => void) | undefined
  side.qp.setCompletionHandler((tag, error) => {
    if (state.posting) state.duringPost++
    const list = reports.get(tag) ?? []
    list.push(error?.code)
    reports.set(tag, list)
    wake?.()
  })
  const post = (fn: () => void) => {
    state.posting = true
    try { fn() } finally { state.posting = false }
  }
  const until = (count: number) => within(new Promise<void>((resolve) => {
    const check = () => { if (reports.size >= count) { wake = undefined; resolve() } }
    wake = check
    check()
  }), 10_000, `${count} reports`)
  return { reports, state, post, until }
}

describe('tagged operations (qp.postWrite / qp.postRead / qp.postFetchAndAdd / qp.postCompareAndSwap)', () => {
  for (const pollMode of ['busy', 'event'] as const) {
    it(`writes and reads move the right bytes; each tag is reported once, never inside its post (${pollMode} CQ)`, async () => {
      const { a, b } = await pair(pollMode)
      const r = recorder(a)
      const remote = b.region.asRemote()
      a.region.bytes.set(pattern(32768, 1), 0)
      // 128 writes of 256 bytes, then 64 reads of other bytes back.
      for (let i = 0; i < 128; i++) r.post(() => a.qp.postWrite(a.region.slice(256 * i, 256), remote.slice(256 * i, 256), i))
      await r.until(128)
      expect(Buffer.compare(b.region.bytes.subarray(0, 32768), a.region.bytes.subarray(0, 32768))).toBe(0)
      b.region.bytes.set(pattern(16384, 2), 40960)
      for (let i = 0; i < 64; i++) r.post(() => a.qp.postRead(a.region.slice(32768 + 256 * i, 256), remote.slice(40960 + 256 * i, 256), 1000 + i))
      await r.until(192)
      expect(Buffer.compare(a.region.bytes.subarray(32768, 49152), pattern(16384, 2))).toBe(0)
      for (const [, list] of r.reports) expect(list).toEqual([undefined])
      expect(r.state.duringPost).toBe(0)
      expect(a.qp.outstanding).toBe(0)
      expect(a.region.inflight).toBe(0)
    })
  }

  it('an explicit cq.poll() delivers the completion synchronously, as ibv_poll_cq', async () => {
    const { a, b } = await pair('event')
    const r = recorder(a)
    a.region.bytes.set(pattern(8, 3), 0)
    a.qp.postWrite(a.region.slice(0, 8), b.region.asRemote().slice(0, 8), 7)
    for (let i = 0; i < 10_000_000 && r.reports.size === 0; i++) a.cq.poll()
    expect(r.reports.get(7)).toEqual([undefined])
    expect(Buffer.compare(b.region.bytes.subarray(0, 8), pattern(8, 3))).toBe(0)
  })

  it('keeps the send queue in call order with promise requests gathered in the same turn', async () => {
    const { a, b } = await pair()
    const r = recorder(a)
    const remote = b.region.asRemote()
    a.region.bytes.set(pattern(64, 10), 0)
    a.region.bytes.set(pattern(64, 11), 64)
    a.region.bytes.set(pattern(64, 12), 128)
    const first = a.qp.write(a.region.slice(0, 64), remote.slice(0, 64)) // posted at once
    const second = a.qp.write(a.region.slice(64, 64), remote.slice(0, 64)) // gathered for the end of the turn
    a.qp.postWrite(a.region.slice(128, 64), remote.slice(0, 64), 1) // must go after `second`
    await within(Promise.all([first, second]))
    await r.until(1)
    expect(Buffer.compare(b.region.bytes.subarray(0, 64), pattern(64, 12))).toBe(0)
  })

  it('a wrong rkey is reported with REM_ACCESS_ERR and its tag; the QP is then failed and posts throw ERR_QP_STATE', async () => {
    const { a, b } = await pair()
    const r = recorder(a)
    const wrong = new RemoteRegion(b.region.asRemote().addr, (b.region.rkey ^ 0x5a5a00) >>> 0, 65536)
    a.qp.postWrite(a.region.slice(0, 64), wrong.slice(0, 64), 42)
    await r.until(1)
    expect(r.reports.get(42)).toEqual(['REM_ACCESS_ERR'])
    expect(() => a.qp.postWrite(a.region.slice(0, 64), b.region.asRemote().slice(0, 64), 43)).toThrow(expect.objectContaining({ code: 'ERR_QP_STATE' }))
    expect(a.region.inflight).toBe(0)
  })

  it('bad input throws at once with a code, and posts nothing', async () => {
    const { a, b } = await pair()
    const remote = b.region.asRemote()
    const code = (fn: () => void) => { try { fn(); return 'no error' } catch (error) { return (error as RdmaError).code } }
    expect(code(() => a.qp.postWrite(a.region.slice(0, 8), remote.slice(0, 8), 1))).toBe('ERR_NO_HANDLER')
    a.qp.setCompletionHandler(() => {})
    expect(code(() => a.qp.postWrite({} as never, remote.slice(0, 8), 1))).toBe('ERR_INVALID_ARG_TYPE')
    expect(code(() => a.qp.postRead(a.region.slice(0, 8), {} as never, 1))).toBe('ERR_INVALID_ARG_TYPE')
    expect(code(() => a.qp.postFetchAndAdd(a.region.slice(0, 8), {} as never, 1n, 1))).toBe('ERR_INVALID_ARG_TYPE')
    expect(() => a.qp.postRead(a.region.slice(0, 8), remote.slice(0, 16), 1)).toThrow('a remote slice of 8 bytes (the local length)')
    // The first failed check names the error: a foreign region is named before a bad length (the documented order).
    const elsewhere = device.allocPd()
    expect(code(() => a.qp.postRead(elsewhere.allocRegion(64).slice(0, 8), remote.slice(0, 16), 1))).toBe('ERR_WRONG_PD')
    // READs and atomics need RC, a WRITE a connected QP: refused by type before the state is looked at.
    const ucCq = device.createCq()
    const uc = elsewhere.createQp({ type: 'UC', sendCq: ucCq })
    uc.setCompletionHandler(() => {})
    const ucRegion = elsewhere.allocRegion(64)
    expect(code(() => uc.postRead(ucRegion.slice(0, 8), remote.slice(0, 8), 1))).toBe('ERR_QP_TYPE')
    expect(code(() => uc.postFetchAndAdd(ucRegion.slice(0, 8), remote.slice(0, 8), 1n, 1))).toBe('ERR_QP_TYPE')
    expect(code(() => uc.postWrite(ucRegion.slice(0, 8), remote.slice(0, 8), 1))).toBe('ERR_QP_STATE') // UC writes: refused only for its state (RESET)
    uc.close()
    ucCq.close()
    expect(code(() => a.qp.postWrite(a.region.slice(0, 8), remote.slice(0, 8), -1))).toBe('ERR_OUT_OF_RANGE')
    expect(code(() => a.qp.postWrite(a.region.slice(0, 8), remote.slice(0, 8), 2 ** 32))).toBe('ERR_OUT_OF_RANGE')
    expect(code(() => a.qp.postWrite(a.region.slice(0, 8), remote.slice(0, 16), 1))).toBe('ERR_OUT_OF_RANGE')
    expect(code(() => a.qp.setCompletionHandler('no' as never))).toBe('ERR_INVALID_ARG_TYPE')
    const otherPd = device.allocPd()
    const foreign = otherPd.allocRegion(64)
    expect(code(() => a.qp.postWrite(foreign.slice(0, 8), remote.slice(0, 8), 1))).toBe('ERR_WRONG_PD')
    foreign.deregister()
    otherPd.close()
    elsewhere.close()
    expect(code(() => a.qp.postWrite(foreign.slice(0, 8), remote.slice(0, 8), 1))).toBe('ERR_CLOSED')
    expect(a.qp.outstanding).toBe(0)
  })

  /** A pair whose peer answers nothing (its QP in the error state): requests stay in flight until RC gives up. */
  async function silentPeer() {
    const { a, b, close } = await connectedPair(device, { size: 1 << 16, pollMode: 'event', connect: { retryCount: 1, timeout: 14 } })
    pairs.push(close)
    b.qp.modify('ERR')
    return { a, b }
  }

  it('a full send queue throws ERR_QUEUE_FULL (it never waits); when RC gives up, every request is reported once', async () => {
    const { a, b } = await silentPeer()
    const r = recorder(a)
    const remote = b.region.asRemote()
    const depth = a.qp.caps.maxSendWr
    let thrown: string | undefined
    let posted = 0
    for (; posted <= depth; posted++) {
      try { a.qp.postWrite(a.region.slice(0, 8), remote.slice(0, 8), posted) } catch (error) { thrown = (error as RdmaError).code; break }
    }
    expect(thrown).toBe('ERR_QUEUE_FULL')
    expect(posted).toBe(depth)
    expect(() => a.qp.setCompletionHandler(undefined)).toThrow(expect.objectContaining({ code: 'ERR_BUSY' }))
    await r.until(depth)
    const codes = [...r.reports.values()].map((list) => { expect(list).toHaveLength(1); return list[0] })
    expect(codes[0]).toBe('RETRY_EXC_ERR')
    expect(new Set(codes.slice(1))).toEqual(new Set(['WR_FLUSH_ERR']))
    a.qp.setCompletionHandler(undefined)
  })

  it('a region with tagged requests in flight refuses deregister(); closing the QP reports each one with ERR_CLOSED after close() returns', async () => {
    const { a, b } = await silentPeer()
    const r = recorder(a)
    const extra = a.pd.allocRegion(4096)
    const remote = b.region.asRemote()
    for (let i = 0; i < 64; i++) a.qp.postWrite(extra.slice(64 * i, 64), remote.slice(64 * i, 64), i)
    expect(() => extra.deregister()).toThrow(expect.objectContaining({ code: 'ERR_BUSY' }))
    a.qp.close()
    expect(r.reports.size).toBe(0)
    expect(extra.inflight).toBe(0) // the device is done with it: the QP is destroyed
    await r.until(64)
    for (const [, list] of r.reports) expect(list).toEqual(['ERR_CLOSED'])
    extra.deregister()
  })

  it('tagged atomics: 200 fetch-and-adds chained from the handler land exactly once each (every old value seen once); compare-and-swap leaves its old value; bad operands throw at once', async () => {
    const { a, b } = await pair('event')
    setU64(b.region, 1024, 1000n)
    const remote = b.region.asRemote().slice(1024, 8)
    const olds: bigint[] = []
    const errors: Array<string | undefined> = []
    let posted = 0
    let resolveDone!: () => void
    const done = new Promise<void>((resolve) => { resolveDone = resolve })
    const post = () => { a.qp.postFetchAndAdd(a.region.slice(8 * (posted % 16), 8), remote, 1n, posted); posted++ }
    a.qp.setCompletionHandler((tag, error) => {
      errors.push(error?.code)
      olds.push(u64(a.region, 8 * (tag % 16)))
      if (posted < 200) post()
      else if (olds.length === 200) resolveDone()
    })
    post()
    await within(done, 30_000, '200 fetch-and-adds')
    expect(errors.every((e) => e === undefined)).toBe(true)
    expect([...olds].sort((x, y) => (x < y ? -1 : 1))).toEqual(Array.from({ length: 200 }, (_, i) => 1000n + BigInt(i)))
    expect(u64(b.region, 1024)).toBe(1200n)

    const casDone = new Promise<string | undefined>((resolve) => a.qp.setCompletionHandler((_tag, error) => resolve(error?.code)))
    a.qp.postCompareAndSwap(a.region.slice(512, 8), remote, 1200n, 0xdead_beef_0000_0001n, 9)
    expect(await within(casDone, 10_000, 'the compare-and-swap')).toBeUndefined()
    expect(u64(a.region, 512)).toBe(1200n)
    expect(u64(b.region, 1024)).toBe(0xdead_beef_0000_0001n)

    const code = (fn: () => void) => { try { fn(); return 'no error' } catch (error) { return (error as RdmaError).code } }
    expect(code(() => a.qp.postFetchAndAdd(a.region.slice(0, 4), remote, 1n, 1))).toBe('ERR_OUT_OF_RANGE')
    expect(code(() => a.qp.postFetchAndAdd(a.region.slice(0, 8), b.region.asRemote().slice(0, 16), 1n, 1))).toBe('ERR_OUT_OF_RANGE')
    expect(code(() => a.qp.postFetchAndAdd(a.region.slice(0, 8), remote, 1 as unknown as bigint, 1))).toBe('ERR_INVALID_ARG_TYPE')
    expect(code(() => a.qp.postCompareAndSwap(a.region.slice(0, 8), remote, 0n, -1n, 1))).toBe('ERR_OUT_OF_RANGE')
    expect(u64(b.region, 1024), 'nothing was posted by the refused calls').toBe(0xdead_beef_0000_0001n)
    expect(a.qp.outstanding).toBe(0)
  })
})
