// The transfer engine at scale: one write() and one read() of many scattered
// blocks between segments larger than 4 GiB, with blocks on both sides past
// 2^32 (and a run of contiguous blocks that straddles 2^32 locally, coalesced
// and sliced), over 1 and 4 QPs; every byte of every block checked.
//
// Two sizes (test/rdma/scale.ts does the work):
// - `npm test` (CI, a 10 GiB guest): 8192 blocks of 16 KiB (128 MiB) between
//   two segments of 4 GiB + 256 MiB that are the same memory registered by
//   both agents (4.25 GiB pinned, not 8.5): the local blocks around 2^32, the
//   remote ones all past it, the two ranges disjoint.
// - `npm run test:scale` (NODE_IBVERBS_SCALE=full, a 14 GiB guest): 98304
//   blocks of 48 KiB (4.5 GiB) from a local segment of 4.5 GiB (every slot, in
//   random order) into random slots of a 5 GiB pool, and back; then
//   ib_write_bw and ib_read_bw in the same boot on the same device move the
//   same bytes at the same message size. Prints a table (docs/benchmarks.md,
//   "Transfers of many GiB"); no figure is a pass condition.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { GiB, KiB, MiB, meminfo, ScaleRig, TWO_32, type ScaleConfig, type ScaleResult } from './scale.js'
import { perftest, roceV2Ipv4GidIndex } from '../../bench/perftest.mjs'

const full = process.env.NODE_IBVERBS_SCALE === 'full'
const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const TIMEOUT_MS = full ? 3_600_000 : 600_000 // bounds, not thresholds: a hang fails the test

const config: ScaleConfig = full
  ? {
    blocks: 98304, blockSize: 48 * KiB,
    localBytes: 4.5 * GiB, remoteBytes: 5 * GiB,
    local: { base: 0, count: 98304 }, remote: { base: 0, count: Math.floor((5 * GiB) / (48 * KiB)) },
    run: 64, qps: [1, 4],
  }
  : {
    blocks: 8192, blockSize: 16 * KiB,
    localBytes: 4 * GiB + 256 * MiB, remoteBytes: 'shared',
    local: { base: 4 * GiB - 64 * MiB, count: (128 * MiB) / (16 * KiB) },
    remote: { base: 4 * GiB + 64 * MiB, count: (192 * MiB) / (16 * KiB) },
    run: 64, qps: [1, 4],
  }
const pinned = config.localBytes + (config.remoteBytes === 'shared' ? 0 : config.remoteBytes)
const needed = pinned + 1.5 * GiB

let rig: ScaleRig | undefined
const results: ScaleResult[] = []
beforeAll(async () => {
  const mb = Math.ceil((needed + GiB) / MiB)
  if (meminfo('MemTotal') < needed) {
    throw new Error(`This file needs about ${(needed / GiB).toFixed(1)} GiB of memory (${(pinned / GiB).toFixed(2)} GiB of registered segments); this machine has ${(meminfo('MemTotal') / GiB).toFixed(1)} GiB: run it with scripts/softroce.sh run --memory ${mb} (${full ? 'npm run test:scale does' : 'scripts/test.mjs gives 10240'})`)
  }
  // Memory an earlier file of this process dropped (25.large-memory's 8 GiB) is unmapped only once collected.
  for (let i = 0; i < 2; i++) {
    ;(globalThis as { gc?: () => void }).gc?.()
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  if (meminfo('MemAvailable') < needed) {
    throw new Error(`This file needs about ${(needed / GiB).toFixed(1)} GiB of free memory; ${(meminfo('MemAvailable') / GiB).toFixed(1)} GiB of ${(meminfo('MemTotal') / GiB).toFixed(1)} GiB is available (an earlier file's memory still held?)`)
  }
  rig = await ScaleRig.open(config, host)
  console.log(`[105.scale] ${config.blocks} blocks of ${config.blockSize} B (${(rig.bytes / MiB).toFixed(0)} MiB), segments ${(config.localBytes / GiB).toFixed(2)} GiB local and ${config.remoteBytes === 'shared' ? 'the same memory' : `${(config.remoteBytes / GiB).toFixed(2)} GiB`} remote; registration ${rig.registerMs.join(', ')} ms`)
}, TIMEOUT_MS)
afterAll(async () => {
  await rig?.close()
  rig = undefined
  ;(globalThis as { gc?: () => void }).gc?.() // the GiBs of NativeMemory go with their last reference
}, 120_000)

describe(`transfers between segments over 4 GiB (${full ? 'full: > 4 GiB per call' : 'CI size'})`, () => {
  it('the layout puts blocks past 2^32 on both sides, one straddling it locally, none overlapping, inside the segments', () => {
    const { localOffsets, remoteOffsets } = rig!.layout
    const bs = config.blockSize
    const past = (offsets: Float64Array) => offsets.filter((o) => o >= TWO_32).length
    const max = (offsets: Float64Array) => offsets.reduce((a, b) => Math.max(a, b), 0)
    const min = (offsets: Float64Array) => offsets.reduce((a, b) => Math.min(a, b), Infinity)
    expect(past(localOffsets)).toBeGreaterThan(config.blocks / 20)
    expect(past(remoteOffsets)).toBeGreaterThan(config.blocks / 20)
    expect(localOffsets.some((o) => o < TWO_32 && o + bs > TWO_32)).toBe(full) // 48 KiB slots from 0: one straddles 2^32
    expect(localOffsets.some((o) => o + bs === TWO_32) && localOffsets.some((o) => o === TWO_32)).toBe(!full) // 16 KiB slots: 2^32 is a slot edge
    const remoteEnd = config.remoteBytes === 'shared' ? config.localBytes : config.remoteBytes
    expect(max(localOffsets) + bs).toBeLessThanOrEqual(config.localBytes)
    expect(max(remoteOffsets) + bs).toBeLessThanOrEqual(remoteEnd)
    expect(max(remoteOffsets)).toBeGreaterThan(TWO_32)
    expect(new Set(localOffsets).size).toBe(config.blocks)
    expect(new Set(remoteOffsets).size).toBe(config.blocks)
    if (config.remoteBytes === 'shared') { // one memory: the local and remote ranges must not meet
      expect(max(localOffsets) + bs).toBeLessThanOrEqual(min(remoteOffsets))
    }
  })

  for (const qps of config.qps) {
    for (const op of ['write', 'read'] as const) {
      it(`one ${op}() of every block over ${qps} QP${qps > 1 ? 's' : ''}: every byte of every block in place`, async () => {
        const side = rig!.sides.find((s) => s.qps === qps)!
        const seed = results.length + 1
        const r = await rig!.move(side, op, seed)
        results.push(r)
        console.log(`[105.scale] ${op} ${qps} QP: ${(r.bytes / MiB).toFixed(0)} MiB, ${r.blocks} blocks, ${r.workRequests} WRs in ${(r.ms / 1000).toFixed(1)} s = ${r.mibPerSec.toFixed(1)} MiB/s (prepare ${r.planMs.toFixed(0)} ms; fill ${(r.fillMs / 1000).toFixed(1)} s, check ${(r.checkMs / 1000).toFixed(1)} s)`)
        expect(r.bytes).toBe(rig!.bytes)
        expect(r.blocks).toBe(config.blocks)
        expect(r.bad, `blocks not as sent (first: ${r.bad.first.join(', ')})`).toEqual({ count: 0, first: [] })
      }, TIMEOUT_MS)
    }
  }

  if (full) {
    it('ib_write_bw and ib_read_bw on the same device move the same bytes at the same message size (for the table)', async () => {
      const device = rig!.target.device!.name
      const gidIndex = roceV2Ipv4GidIndex(device)
      // The engine's part is done: its agents closed and its GiBs freed, perftest has the device and the guest alone.
      await rig!.close()
      rig = undefined
      ;(globalThis as { gc?: () => void }).gc?.()
      const perf: Record<string, number> = {}
      for (const test of ['write_bw', 'read_bw'] as const) {
        const r = await perftest({ test, size: config.blockSize, iters: config.blocks, txDepth: 128, device, gidIndex, addr: host, timeoutMs: 1_200_000 }) as { mbPerSec: number; command: string }
        perf[test] = r.mbPerSec
        console.log(`[105.scale] ${r.command}: ${r.mbPerSec.toFixed(1)} MiB/s`)
      }
      const rows = results.map((r) => {
        const base = perf[r.op === 'write' ? 'write_bw' : 'read_bw']!
        return `| ${r.op} | ${r.qps} | ${(r.bytes / GiB).toFixed(2)} GiB | ${r.blocks} x ${r.bytes / r.blocks / KiB} KiB | ${r.workRequests} | ${(r.ms / 1000).toFixed(1)} s | ${r.mibPerSec.toFixed(1)} | ${base.toFixed(1)} | ${(r.mibPerSec / base).toFixed(2)} | ${r.planMs.toFixed(0)} ms | ${r.bad.count} |`
      })
      console.log(['[105.scale] table', '| op | QPs | bytes | blocks | WRs | time | engine MiB/s | ib_*_bw MiB/s | engine / perftest | prepare | bad blocks |', '|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|', ...rows].join('\n'))
      expect(Object.values(perf).every((v) => v > 0)).toBe(true)
    }, TIMEOUT_MS)
  }
})
