// One round of every RC verb across the wire, checked on both sides: host 1
// (active) WRITEs, READs, SENDs and does atomics against host 0 (passive),
// while a fault is on. Each side computes sha256 of what it holds and the
// two are compared over the control channel. Every request is bounded.
import { Access, type Connection, type MemoryRegion, type RemoteSlice } from '../../../dist/index.js'
import { pattern } from '../../rdma/helpers.js'
import type { Control } from './control.js'
import { sha256 } from './wire.js'

export interface Round {
  /** Bytes written and read back (each way). */
  bytes: number
  /** SEND messages and their size. */
  sends: number
  sendSize: number
  /** Fetch-and-adds (then one compare-and-swap). */
  atomics: number
  seed: number
  /** Also READ the source back (default true); see docs/reliability.md for READ under loss on rxe. */
  read?: boolean
  /** Bound on each request. */
  timeoutMs: number
}

export interface RoundResult { writeMBps: number; readMBps: number; writeMs: number; readMs: number; sendMs: number; atomicMs: number; bytesVerified: number }

export const ALL = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic

/** Layout of host 0's region: READ source, WRITE target, counter. */
export function passiveRegionSize(maxBytes: number): number { return 2 * maxBytes + 4096 }

/** Host 0's half: fills the READ source, posts the receives, then checks everything host 1 did. */
export async function passiveRound(conn: Connection, region: MemoryRegion, control: Control, round: Round): Promise<{ bytesVerified: number; problems: string[] }> {
  const { bytes, sends, sendSize, seed, timeoutMs } = round
  region.bytes.set(pattern(bytes, seed), 0)
  region.bytes.fill(0, bytes, 2 * bytes)
  const counter = new DataView(region.bytes.buffer, region.bytes.byteOffset + 2 * bytes, 8)
  counter.setBigUint64(0, 0n, true)
  const inbox = conn.pd.allocRegion(sends * sendSize, Access.LocalWrite)
  try {
    const received = Array.from({ length: sends }, (_, i) => conn.qp.recv(inbox.slice(i * sendSize, sendSize), { timeoutMs }))
    // Awaited after 'done'; until then a timeout must not be an unhandled rejection (it killed host 0 once).
    for (const r of received) r.catch(() => {})
    control.send({ type: 'ready', readSha: sha256(region.bytes.subarray(0, bytes)) })
    const done = await control.expect('done', timeoutMs * 4)
    const completions = await Promise.all(received)
    const problems: string[] = []
    if (sha256(region.bytes.subarray(bytes, 2 * bytes)) !== done.writeSha) problems.push('WRITE target differs from what host 1 wrote')
    completions.forEach((wc, i) => {
      if (wc.byteLength !== sendSize) problems.push(`SEND ${i}: ${wc.byteLength} bytes`)
      if (sha256(inbox.bytes.subarray(i * sendSize, (i + 1) * sendSize)) !== (done.sendShas as string[])[i]) problems.push(`SEND ${i} differs`)
    })
    // host 1 did `atomics` fetch-and-adds of 1, then swapped `atomics` for 0xabcdef.
    const value = counter.getBigUint64(0, true)
    if (value !== 0xabcdefn) problems.push(`counter is ${value}, expected 0xabcdef`)
    control.send({ type: 'verified', problems })
    return { bytesVerified: bytes + sends * sendSize, problems }
  } finally {
    try { inbox.deregister() } catch { /* a receive that timed out still names it: it goes with the connection */ }
  }
}

/** Host 1's half: every verb against host 0's region, verified here; returns the figures. */
export async function activeRound(conn: Connection, remote: { slice(offset: number, length: number): RemoteSlice }, control: Control, round: Round): Promise<RoundResult & { problems: string[] }> {
  const { bytes, sends, sendSize, atomics, seed, timeoutMs } = round
  const local = conn.pd.allocRegion(2 * bytes + sends * sendSize + 8, Access.LocalWrite)
  try {
    const { readSha } = await control.expect('ready', timeoutMs * 4)
    const data = pattern(bytes, seed + 1)
    local.bytes.set(data, 0)
    let t = performance.now()
    await conn.qp.write(local.slice(0, bytes), remote.slice(bytes, bytes), { timeoutMs })
    const writeMs = performance.now() - t
    t = performance.now()
    const problems: string[] = []
    if (round.read !== false) {
      await conn.qp.read(local.slice(bytes, bytes), remote.slice(0, bytes), { timeoutMs })
      if (sha256(local.bytes.subarray(bytes, 2 * bytes)) !== readSha) problems.push('READ brought back other bytes than host 0 holds')
    }
    const readMs = round.read !== false ? performance.now() - t : NaN
    const sendShas: string[] = []
    const base = 2 * bytes
    t = performance.now()
    for (let i = 0; i < sends; i++) {
      const message = pattern(sendSize, seed + 100 + i)
      local.bytes.set(message, base)
      sendShas.push(sha256(message))
      await conn.qp.send(local.slice(base, sendSize), { timeoutMs })
    }
    const sendMs = performance.now() - t
    t = performance.now()
    const counter = remote.slice(2 * bytes, 8)
    for (let i = 0; i < atomics; i++) {
      const before = await conn.qp.fetchAndAdd(counter, 1n, { timeoutMs })
      // Exactly once: a replayed or lost atomic shows as a skipped or repeated value.
      if (before !== BigInt(i)) problems.push(`fetchAndAdd ${i} returned ${before}`)
    }
    const old = await conn.qp.compareAndSwap(counter, BigInt(atomics), 0xabcdefn, { timeoutMs })
    if (old !== BigInt(atomics)) problems.push(`compareAndSwap found ${old}, expected ${atomics}`)
    const atomicMs = performance.now() - t
    control.send({ type: 'done', writeSha: sha256(data), sendShas })
    const verified = await control.expect('verified', timeoutMs * 4)
    problems.push(...(verified.problems as string[]).map((p) => `host 0: ${p}`))
    // MiB/s, the unit of perftest's "MB/sec".
    const mbps = (ms: number) => Math.round((bytes / 1048576 / (ms / 1000)) * 100) / 100
    return { writeMBps: mbps(writeMs), readMBps: mbps(readMs), writeMs, readMs, sendMs, atomicMs, bytesVerified: (round.read !== false ? 2 : 1) * bytes + sends * sendSize, problems }
  } finally {
    // A request that timed out still names the buffer: then it goes with the connection, and the first error stands.
    try { local.deregister() } catch { /* see above */ }
  }
}
