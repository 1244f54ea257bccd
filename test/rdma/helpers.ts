// Shared setup for the RDMA suites. They need a real device: when none is
// there they fail (loudly), they never skip. scripts/test.mjs provides one.
import { Access, openDevice, type CompletionQueue, type Device, type MemoryRegion, type ProtectionDomain, type QueuePair, type QueuePairOptions } from '../../dist/index.js'
// pattern() and within() are the engine suites' (test/engine/util.ts), which have no verbs imports.
export { pattern, within } from '../engine/util.js'

export const ALL_ACCESS = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic

export function testDevice(): Device {
  try {
    return openDevice(process.env.SOFTROCE_DEVICE || undefined)
  } catch (error) {
    throw new Error(`The RDMA suites need an RDMA device; run them with 'npm test' (it provides Soft-RoCE). ${(error as Error).message}`)
  }
}

export interface Side { pd: ProtectionDomain; cq: CompletionQueue; qp: QueuePair; region: MemoryRegion }

/** Two RC (or UC) queue pairs on one device, connected to each other, each with a registered region. */
export async function connectedPair(device: Device, options: {
  size?: number; access?: number; qp?: Partial<QueuePairOptions>; connect?: Record<string, number>; pollMode?: 'event' | 'busy'
} = {}): Promise<{ a: Side; b: Side; close: () => void }> {
  const make = (): Side => {
    const pd = device.allocPd()
    const cq = device.createCq({ entries: 1024, pollMode: options.pollMode ?? 'event' })
    const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 256, maxRecvWr: 256, ...options.qp })
    const region = pd.allocRegion(options.size ?? 1 << 20, options.access ?? ALL_ACCESS)
    return { pd, cq, qp, region }
  }
  const a = make()
  const b = make()
  await a.qp.connect(b.qp.endpoint(), options.connect)
  await b.qp.connect(a.qp.endpoint(), options.connect)
  return { a, b, close: () => { for (const s of [a, b]) { s.qp.close(); s.cq.close(); s.pd.close() } } }
}

/**
 * testDevice() and a connectedPair() on it, for a file's beforeAll; close()
 * closes both (its afterAll). (No vitest hooks here: the two-host fault
 * campaign bundles this file to run under plain node.)
 */
export async function openTestPair(options: Parameters<typeof connectedPair>[1] = {}): Promise<{ device: Device; a: Side; b: Side; close: () => void }> {
  const device = testDevice()
  try {
    const { a, b, close } = await connectedPair(device, options)
    return { device, a, b, close: () => { close(); device.close() } }
  } catch (error) {
    device.close()
    throw error
  }
}

export function u64(region: MemoryRegion, offset: number): bigint {
  return new DataView(region.bytes.buffer, region.bytes.byteOffset).getBigUint64(offset, true)
}

export function setU64(region: MemoryRegion, offset: number, value: bigint): void {
  new DataView(region.bytes.buffer, region.bytes.byteOffset).setBigUint64(offset, value, true)
}

/** A QP that receives through an SRQ, connected to a plain sender QP, on one PD. */
export async function srqPair(device: Device, regionSize = 4096) {
  const pd = device.allocPd()
  const cq = device.createCq()
  const srq = pd.createSrq({ maxWr: 16 })
  const region = pd.allocRegion(regionSize, Access.LocalWrite)
  const receiver = pd.createQp({ type: 'RC', sendCq: cq, srq })
  const sender = pd.createQp({ type: 'RC', sendCq: cq })
  await receiver.connect(sender.endpoint())
  await sender.connect(receiver.endpoint())
  return { pd, srq, region, receiver, sender, close: () => { pd.close(); cq.close() } }
}

/** Fails instead of hanging: rejects if `promise` has not settled after `ms`. */
/** Blocks the thread (the event loop does not turn) until `done()` or `ms` pass. */
export function waitWithoutLoop(done: () => boolean, ms: number): void {
  const cell = new Int32Array(new SharedArrayBuffer(4))
  const deadline = Date.now() + ms
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`not done after ${ms} ms`)
    Atomics.wait(cell, 0, 0, 1)
  }
}

/**
 * Deterministic scattered blocks over `bytes`: pieces of 1..maxPages x 4 KiB
 * (the last one shorter if need be) taken in order at the source, placed in
 * a shuffled order at the destination.
 */
export function scatter(bytes: number, seed: number, maxPages: number): Array<{ src: number; dst: number; length: number }> {
  let x = seed >>> 0
  const next = () => { x = (x * 1103515245 + 12345) >>> 0; return x >>> 8 } // the low bits of this LCG repeat quickly
  const lengths: number[] = []
  for (let total = 0; total < bytes;) {
    const length = Math.min(bytes - total, (1 + (next() % maxPages)) * 4096)
    lengths.push(length)
    total += length
  }
  const order = lengths.map((_, i) => i)
  for (let i = order.length - 1; i > 0; i--) { const j = next() % (i + 1); [order[i], order[j]] = [order[j]!, order[i]!] }
  const dst = new Array<number>(lengths.length)
  let at = 0
  for (const i of order) { dst[i] = at; at += lengths[i]! }
  let src = 0
  return lengths.map((length, i) => { const piece = { src, dst: dst[i]!, length }; src += length; return piece })
}
