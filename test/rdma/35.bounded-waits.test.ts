// Requests that wait for something the library rations (a send-queue slot, a
// CQ entry) stay bounded by their timeoutMs / signal, and completions are
// found whichever CQ they arrive on.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { Access, type CompletionQueue, type Device, type ProtectionDomain, type QueuePair, type RemoteSlice } from '../../dist/index.js'
import { ALL_ACCESS, connectedPair, pattern, srqPair, testDevice, within } from './helpers.js'
import { countMrsOfPd } from './resources.js'

let device: Device
const cleanups: Array<() => void> = []
beforeAll(() => { device = testDevice() })
afterEach(() => { while (cleanups.length) cleanups.pop()!() })
afterAll(() => device?.close())

/**
 * A sender whose send queue (4 slots) is full of sends that never complete:
 * the peer posts no receives and rnrRetry 7 retries forever.
 */
async function rnrStarved() {
  const p = await connectedPair(device, { size: 65536, qp: { maxSendWr: 4 }, connect: { rnrRetry: 7 } })
  cleanups.push(p.close)
  const { a } = p
  expect(a.qp.caps.maxSendWr).toBe(4)
  const stuck = Array.from({ length: 4 }, (_, i) => a.qp.send(a.region.slice(i * 64, 64)))
  for (const s of stuck) s.catch(() => {}) // rejected with ERR_CLOSED at cleanup
  await new Promise((resolve) => setTimeout(resolve, 50))
  expect(a.qp.outstanding).toBe(4)
  return a
}

describe('a request waiting for a send-queue slot', () => {
  it('rejects with ETIMEDOUT when its timeoutMs elapses, and leaves the queue', async () => {
    const a = await rnrStarved()
    const error = await within(a.qp.write(a.region.slice(0, 8), a.region.asRemote().slice(8, 8), { timeoutMs: 200 }).catch((e) => e), 10_000, 'write with timeoutMs 200')
    expect(error).toMatchObject({ name: 'RdmaError', code: 'ETIMEDOUT', verb: 'write', qpn: a.qp.qpn })
    expect(error.message).toMatch(/waiting for a queue slot/)
    expect(a.qp.outstanding).toBe(4) // never posted
    // A later request with a deadline is not stuck behind the one that left.
    await expect(within(a.qp.send(a.region.slice(0, 8), { timeoutMs: 100 }), 10_000, 'second send')).rejects.toMatchObject({ code: 'ETIMEDOUT' })
  })

  it('rejects with ABORT_ERR when its signal is aborted', async () => {
    const a = await rnrStarved()
    const controller = new AbortController()
    const pending = a.qp.send(a.region.slice(0, 8), { signal: controller.signal }).catch((e) => e)
    setTimeout(() => controller.abort('give up'), 100)
    const error = await within(pending, 10_000, 'send with a signal')
    expect(error).toMatchObject({ name: 'RdmaError', code: 'ABORT_ERR', verb: 'send', cause: 'give up' })
    expect(a.qp.outstanding).toBe(4)
    // An already-aborted signal is refused before anything is posted or queued.
    await expect(a.qp.send(a.region.slice(0, 8), { signal: AbortSignal.abort('no') })).rejects.toMatchObject({ code: 'ABORT_ERR' })
  })

  it('is posted when a slot frees up, and its deadline keeps running', async () => {
    // The peer posts its receives late: the waiting send then goes out and completes.
    const p = await connectedPair(device, { size: 65536, qp: { maxSendWr: 2 }, connect: { rnrRetry: 7, minRnrTimer: 1 } })
    cleanups.push(p.close)
    const { a, b } = p
    a.region.bytes.set(pattern(3 * 64, 1), 0)
    const sends = [0, 1, 2].map((i) => a.qp.send(a.region.slice(i * 64, 64), { timeoutMs: 20_000 }))
    const recvs = [0, 1, 2].map((i) => b.qp.recv(b.region.slice(i * 64, 64), { timeoutMs: 20_000 }))
    await within(Promise.all([...sends, ...recvs]), 30_000, 'sends and receives')
    expect(Buffer.compare(b.region.bytes.subarray(0, 192), pattern(192, 1))).toBe(0)
  })
})

describe('completion queue credits', () => {
  /** Two QPs whose send CQ is much smaller than their outstanding work. */
  async function sharedSmallCq() {
    const pd = device.allocPd()
    const small = device.createCq({ entries: 16 })
    const big = device.createCq({ entries: 4096 })
    const local = pd.allocRegion(1 << 20, ALL_ACCESS)
    const remote = pd.allocRegion(1 << 20, ALL_ACCESS)
    const make = (cq: CompletionQueue): QueuePair => pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 256 })
    const senders = [make(small), make(small)]
    const peers = [make(big), make(big)]
    for (let i = 0; i < 2; i++) {
      await senders[i]!.connect(peers[i]!.endpoint())
      await peers[i]!.connect(senders[i]!.endpoint())
    }
    cleanups.push(() => { pd.close(); small.close(); big.close() })
    return { small, senders, local, remote }
  }

  it('writes from two QPs never overrun a small shared CQ: all settle, bytes right', async () => {
    const { small, senders, local, remote } = await sharedSmallCq()
    expect(small.entries).toBeLessThan(2 * 200)
    const size = 1024
    local.bytes.set(pattern(2 * 200 * size, 7), 0)
    const writes: Array<Promise<void>> = []
    for (let i = 0; i < 200; i++) {
      for (let q = 0; q < 2; q++) {
        const at = (q * 200 + i) * size
        writes.push(senders[q]!.write(local.slice(at, size), remote.asRemote().slice(at, size), { timeoutMs: 20_000 }))
      }
    }
    const results = await within(Promise.allSettled(writes), 60_000, 'writes')
    const failed = results.filter((r) => r.status === 'rejected') as PromiseRejectedResult[]
    expect(failed.map((r) => (r.reason as { code?: string }).code)).toEqual([])
    expect(Buffer.compare(remote.bytes.subarray(0, 2 * 200 * size), local.bytes.subarray(0, 2 * 200 * size))).toBe(0)
  })

  it('a request that can never fit the CQ is refused with ERR_CQ_TOO_SMALL', async () => {
    const { small, senders, local, remote } = await sharedSmallCq()
    const operations = Array.from({ length: small.entries + 1 }, (_, i) => ({ op: 'write' as const, local: local.slice(i * 8, 8), remote: remote.asRemote().slice(i * 8, 8) }))
    await expect(senders[0]!.postBatch(operations)).rejects.toMatchObject({ code: 'ERR_CQ_TOO_SMALL' })
  })

  it('a request waiting for CQ credit is bounded by its timeoutMs', async () => {
    const pd = device.allocPd()
    const small = device.createCq({ entries: 4 })
    const region = pd.allocRegion(65536, ALL_ACCESS)
    const receiver = pd.createQp({ type: 'RC', sendCq: small, maxRecvWr: 64 })
    const peerCq = device.createCq()
    const peer = pd.createQp({ type: 'RC', sendCq: peerCq })
    cleanups.push(() => { pd.close(); small.close(); peerCq.close() })
    await receiver.connect(peer.endpoint())
    await peer.connect(receiver.endpoint())
    // Receives that no message ever fills hold the CQ's entries.
    const held = Array.from({ length: small.entries }, (_, i) => receiver.recv(region.slice(i * 64, 64)))
    for (const h of held) h.catch(() => {})
    const error = await within(receiver.recv(region.slice(4096, 64), { timeoutMs: 200 }).catch((e) => e), 10_000, 'recv waiting for credit')
    expect(error).toMatchObject({ code: 'ETIMEDOUT', verb: 'recv' })
    expect(error.message).toMatch(/waiting for a queue slot/) // it was never posted
    expect(receiver.outstanding).toBe(small.entries)
  })
})

describe('shared receive queue', () => {
  it('a receive completes on the recv CQ of whichever attached QP took the message', async () => {
    const pd = device.allocPd()
    const cqA = device.createCq({ pollMode: 'busy' })
    const cqB = device.createCq({ pollMode: 'busy' })
    const cqS = device.createCq()
    const srq = pd.createSrq({ maxWr: 16 })
    const region = pd.allocRegion(8192, Access.LocalWrite)
    const r1 = pd.createQp({ type: 'RC', sendCq: cqA, srq })
    const r2 = pd.createQp({ type: 'RC', sendCq: cqB, srq })
    const s1 = pd.createQp({ type: 'RC', sendCq: cqS })
    const s2 = pd.createQp({ type: 'RC', sendCq: cqS })
    cleanups.push(() => { pd.close(); for (const cq of [cqA, cqB, cqS]) cq.close() })
    for (const [r, s] of [[r1, s1], [r2, s2]] as const) {
      await r.connect(s.endpoint())
      await s.connect(r.endpoint())
    }
    const received = srq.recv(region.slice(0, 256), { timeoutMs: 10_000 })
    // Both receive CQs wait for it (busy CQs poll only while something waits).
    expect([cqA.pending, cqB.pending]).toEqual([1, 1])
    region.bytes.set(pattern(256, 3), 4096)
    await s2.send(region.slice(4096, 256), { timeoutMs: 10_000 })
    const wc = await within(received, 15_000, 'srq.recv')
    expect(wc).toMatchObject({ qpn: r2.qpn, byteLength: 256 })
    expect(Buffer.compare(region.bytes.subarray(0, 256), pattern(256, 3))).toBe(0)
    expect([cqA.pending, cqB.pending]).toEqual([0, 0])
  })
})

describe('an SRQ receive that completes with an error', () => {
  it('fails the QP it arrived on, as a receive of its own would', async () => {
    const { pd, srq, region, receiver, sender, close } = await srqPair(device)
    cleanups.push(close)
    // 8 bytes of buffer for a 64-byte message: the receive completes with an error (rxe: LOC_QP_OP_ERR).
    const received = srq.recv(region.slice(0, 8), { timeoutMs: 10_000 }).catch((e) => e)
    const other = pd.createQp({ type: 'RC', sendCq: receiver.sendCq, srq }) // attached too, not connected
    cleanups.push(() => other.close())
    const sent = sender.send(region.slice(1024, 64), { timeoutMs: 10_000 }).catch((e) => e)
    const failure = await within(received, 15_000, 'srq.recv')
    expect(failure).toMatchObject({ name: 'RdmaError', verb: 'recv', qpn: receiver.qpn })
    expect(failure.code).toMatch(/^LOC_/)
    await within(sent, 15_000, 'the send')
    expect(receiver.error, 'the failure of the QP the message arrived on').toMatchObject({ code: failure.code, qpn: receiver.qpn })
    expect(receiver.state).toBe('ERR')
    await expect(receiver.write(region.slice(0, 8), region.asRemote().slice(8, 8))).rejects.toMatchObject({ code: 'ERR_QP_STATE', status: failure.code })
    // The SRQ and its other QP are not failed by it.
    expect(other.error).toBeUndefined()
    expect(srq.closed).toBe(false)
  })
})

describe('the result slots of atomics that timed out or were aborted', () => {
  const ROUNDS = 3
  const PER_ROUND = 200 // 600 in all: more than the 512 slots of one page (lib/verbs/atomic-slots.ts)

  /**
   * A QP connected to a QP that is then destroyed: nothing ever answers its
   * requests, which fail with RETRY_EXC_ERR after retryCount + 1 ACK timeouts
   * of 4.096 us * 2^timeout each.
   */
  async function unanswered(pd: ProtectionDomain, cq: CompletionQueue, connect: { timeout: number; retryCount: number }): Promise<QueuePair> {
    const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 256 })
    const gone = pd.createQp({ type: 'RC', sendCq: cq })
    await qp.connect(gone.endpoint(), connect)
    gone.close()
    return qp
  }

  /**
   * PER_ROUND fetch-and-adds that all end (timeoutMs 1, or a signal aborted right after posting)
   * before their completions arrive: each settles with its code, not with the completion's status.
   */
  async function expiredRound(qp: QueuePair, remote: RemoteSlice, how: 'timeout' | 'abort'): Promise<void> {
    const controller = new AbortController()
    const options = how === 'timeout' ? { timeoutMs: 1 } : { signal: controller.signal }
    const atomics = Array.from({ length: PER_ROUND }, () => qp.fetchAndAdd(remote, 1n, options))
    controller.abort()
    const results = await within(Promise.allSettled(atomics), 30_000, 'the atomics')
    const codes = new Set(results.map((r) => r.status === 'rejected' ? (r.reason as { code?: string }).code : 'resolved'))
    expect([...codes]).toEqual([how === 'timeout' ? 'ETIMEDOUT' : 'ABORT_ERR'])
  }

  async function setup() {
    const pd = device.allocPd()
    const cq = device.createCq({ entries: 1024 })
    const target = pd.allocRegion(4096, ALL_ACCESS)
    cleanups.push(() => { pd.close(); cq.close() })
    // This PD's regions only: an earlier file's regions freed by the collector meanwhile must not count.
    const mrsOfPd = (): number => countMrsOfPd(target.lkey)
    return { pd, cq, remote: target.asRemote().slice(0, 8), mrsOfPd, mrs: mrsOfPd() }
  }

  it('come back once their completion arrives: a PD keeps one page of slots however many time out', async () => {
    const { pd, cq, remote, mrs, mrsOfPd } = await setup()
    const qps: QueuePair[] = [] // kept open: only the completions give the slots back
    for (let round = 0; round < ROUNDS; round++) {
      // About 4 x 67 ms before the device gives up: the atomics expire long before.
      const qp = await unanswered(pd, cq, { timeout: 14, retryCount: 3 })
      qps.push(qp)
      await expiredRound(qp, remote, round % 2 === 0 ? 'timeout' : 'abort')
      await within((async () => { while (qp.outstanding > 0) await new Promise((resolve) => setTimeout(resolve, 20)) })(), 30_000, 'the completions of the expired atomics')
      expect(qp.error).toMatchObject({ code: 'RETRY_EXC_ERR' })
    }
    expect(mrsOfPd() - mrs, 'pages of atomic slots the PD registered').toBe(1)
  })

  it('come back when their QP is closed (flushed): a PD keeps one page of slots however many time out', async () => {
    const { pd, cq, remote, mrs, mrsOfPd } = await setup()
    for (let round = 0; round < ROUNDS; round++) {
      // About 8 x 1.07 s before the device gives up: closed long before.
      const qp = await unanswered(pd, cq, { timeout: 18, retryCount: 7 })
      await expiredRound(qp, remote, round % 2 === 0 ? 'abort' : 'timeout')
      expect(qp.outstanding, 'no completion yet: the close flushes them').toBe(PER_ROUND)
      qp.close()
    }
    expect(mrsOfPd() - mrs, 'pages of atomic slots the PD registered').toBe(1)
  })
})
