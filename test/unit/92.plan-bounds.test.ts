// The plan's arithmetic at the edges of what its numbers hold: offsets and
// lengths around 2^32 (where a work request's 32-bit fields end: the remote
// address is sent as two 32-bit halves) and 2^53 (Number.MAX_SAFE_INTEGER,
// where doubles stop counting bytes exactly). Slicing, coalescing, remote
// ordering, the raddr hi/lo split, lengths, and what is refused with which
// code. Then what planning allocates: no JS object, string or boxed number
// per block (V8's sampling heap profiler; bench/plan.mjs reports the figures).
import { Session } from 'node:inspector'
import { setFlagsFromString } from 'node:v8'
import { describe, expect, it } from 'vitest'
import { coalesceRuns, emptyColumns, MAX_SLICES, planSlices, remoteOrderIndexes, sliceRuns, validateColumns, type BlockColumns } from '../../lib/transfer/blocks.js'
import { checkBlocks, segmentsUsed, type Block, type BlockArrays, type CheckedPlan, type TransferOp } from '../../lib/transfer/plan.js'
import { encodeSlices } from '../../lib/transfer/qp-lane.js'
import { LocalTable, RemoteTable, type SegmentMemory } from '../../lib/transfer/segments.js'
import { thrown } from './thrown.js'

const TWO_32 = 2 ** 32
const TWO_53 = 2 ** 53
const MAX = Number.MAX_SAFE_INTEGER // 2^53 - 1

type Row = [number, number, number, number, number] // lseg, loff, rseg, roff, len

function columns(blocks: Row[]): BlockColumns {
  const cols = emptyColumns(blocks.length)
  blocks.forEach(([ls, lo, rs, ro, len], i) => { cols.lseg[i] = ls; cols.loff[i] = lo; cols.rseg[i] = rs; cols.roff[i] = ro; cols.len[i] = len })
  return cols
}

function rows(cols: BlockColumns): Row[] {
  return Array.from({ length: cols.count }, (_, i) => [cols.lseg[i]!, cols.loff[i]!, cols.rseg[i]!, cols.roff[i]!, cols.len[i]!])
}

/** A local table of one segment: plan math needs its length, address and lkey only (no memory behind it). */
function localTable(length: number, address = 0x7f00_0000_0000): LocalTable {
  const table = new LocalTable()
  table.add('kv', { length, address, lkey: 0x1234 } as unknown as SegmentMemory, 'none')
  return table
}

/** A peer's table of one segment, as its 'add' message would describe it. */
function remoteTable(length: number, addr: bigint): RemoteTable {
  const table = new RemoteTable()
  table.add([['pool', '0x' + addr.toString(16), 0xabcd, length, 'read-write']], 1, 1)
  return table
}

const code = (fn: () => unknown): string => (thrown(fn) as { code: string }).code

describe('validateColumns at 2^32 and 2^53', () => {
  it('takes blocks that end exactly at a segment of 2^53 - 1 bytes, and blocks across 2^32', () => {
    expect(validateColumns(columns([[0, MAX - 1, 0, MAX - 1, 1]]), [MAX], [MAX])).toBe(1)
    expect(validateColumns(columns([[0, 0, 0, MAX - 4096, 4096]]), [MAX], [MAX])).toBe(4096)
    expect(validateColumns(columns([[0, TWO_32 - 1, 0, TWO_32 - 1, 2]]), [TWO_32 + 1], [TWO_32 + 1])).toBe(2)
    expect(validateColumns(columns([[0, 0, 0, 0, TWO_32 + 1]]), [TWO_32 + 1], [TWO_32 + 1])).toBe(TWO_32 + 1)
  })

  it('refuses with ERR_BLOCK_RANGE a block one byte past a segment ending at 2^32 or 2^53 - 1, and offsets or lengths that are not safe integers', () => {
    const cases: Array<[Row, number, RegExp]> = [
      [[0, TWO_32 - 1, 0, 0, 2], TWO_32, /local bytes 4294967295..4294967297 are outside the local segment \(4294967296 bytes\)/],
      [[0, 0, 0, TWO_32, 1], TWO_32, /remote bytes 4294967296..4294967297 are outside/],
      [[0, MAX, 0, 0, 1], MAX, /local bytes 9007199254740991..9007199254740992 are outside/],
      [[0, 0, 0, MAX - 1, 2], MAX, /remote bytes 9007199254740990..9007199254740992 are outside/],
      // Sums past 2^53 round, but never down to inside the segment.
      [[0, MAX, 0, 0, MAX], MAX, /local bytes .* are outside/],
      [[0, TWO_53, 0, 0, 1], MAX, /offsets must be integers >= 0/],
      [[0, 0, 0, TWO_53 + 2, 1], MAX, /offsets must be integers >= 0/],
      [[0, 0, 0, 0, TWO_53], MAX, /the length an integer >= 1/],
      [[0, 0, 0, 0, Infinity], MAX, /the length an integer >= 1/],
    ]
    for (const [row, length, message] of cases) {
      const error = thrown(() => validateColumns(columns([row]), [length], [length])) as { code: string; message: string }
      expect(error.code, `${row}`).toBe('ERR_BLOCK_RANGE')
      expect(error.message).toMatch(message)
    }
  })

  it('refuses with ERR_BLOCK_RANGE blocks that add up to more than 2^53 - 1 bytes (overlapping blocks can)', () => {
    const error = thrown(() => validateColumns(columns([[0, 0, 0, 0, MAX], [0, 0, 0, 0, 2]]), [MAX], [MAX])) as { code: string; message: string }
    expect(error.code).toBe('ERR_BLOCK_RANGE')
    expect(error.message).toMatch(/more than one transfer counts exactly/)
    expect(validateColumns(columns([[0, 0, 0, 0, MAX - 1], [0, 0, 0, 0, 1]]), [MAX], [MAX])).toBe(MAX)
  })
})

describe('slicing at 2^32 and 2^53', () => {
  it('cuts a block across 2^32 at exact offsets, the last slice the remainder', () => {
    const { slices } = sliceRuns(columns([[0, TWO_32 - 3072, 1, TWO_32 - 1024, 8192 + 5]]), 4096)
    expect(rows(slices)).toEqual([
      [0, TWO_32 - 3072, 1, TWO_32 - 1024, 4096],
      [0, TWO_32 + 1024, 1, TWO_32 + 3072, 4096],
      [0, TWO_32 + 5120, 1, TWO_32 + 7168, 5],
    ])
  })

  it('cuts a block of more than 4 GiB into slices of 2^31 bytes (a work request\'s 32-bit length is never passed)', () => {
    const { slices, run } = sliceRuns(columns([[0, 0, 0, TWO_32, 2 * TWO_32 + 5]]), 2 ** 31)
    expect(rows(slices).map((r) => r[4])).toEqual([2 ** 31, 2 ** 31, 2 ** 31, 2 ** 31, 5])
    expect(rows(slices).map((r) => r[3])).toEqual([TWO_32, TWO_32 + 2 ** 31, 2 * TWO_32, 2 * TWO_32 + 2 ** 31, 3 * TWO_32])
    expect([...run!]).toEqual([0, 0, 0, 0, 0])
  })

  it('cuts a block that ends at 2^53 - 1 at exact offsets', () => {
    const start = MAX - 10_000
    const { slices } = sliceRuns(columns([[0, start, 0, start, 10_000]]), 4096)
    expect(rows(slices).map((r) => [r[1], r[4]])).toEqual([[start, 4096], [start + 4096, 4096], [start + 8192, 1808]])
    expect(slices.loff[2]! + slices.len[2]!).toBe(MAX)
  })

  it('refuses with ERR_BLOCK_RANGE blocks that would make more than 2^32 - 1 slices (its columns are indexed with 32 bits)', () => {
    const error = thrown(() => sliceRuns(columns([[0, 0, 0, 0, 2 ** 45]]), 4096)) as { code: string; message: string }
    expect(error.message).toMatch(/make 8589934592 work requests of at most 4096 bytes/)
    expect(error.code).toBe('ERR_BLOCK_RANGE')
    expect(MAX_SLICES).toBe(TWO_32 - 1)
  })
})

describe('segmentsUsed', () => {
  it('gives each side\'s distinct segments once, however the slices interleave them (thousands of segments)', () => {
    // Slice i: local segment (i * 7) % 3000 (changes at every slice, each seen several times), remote i >> 2 (runs of 4).
    const n = 12_000
    const slices = columns(Array.from({ length: n }, (_, i) => [(i * 7) % 3000, 0, i >> 2, 0, 1]))
    const used = segmentsUsed({ slices } as unknown as CheckedPlan)
    expect([...used.locals].sort((a, b) => a - b)).toEqual(Array.from({ length: 3000 }, (_, k) => k))
    expect([...used.remotes]).toEqual(Array.from({ length: n / 4 }, (_, k) => k))
  })
})

describe('coalescing and remote order at 2^32 and 2^53', () => {
  it('merges blocks that meet at 2^32 on both sides, and keeps apart those one byte apart there', () => {
    const merged = coalesceRuns(columns([[0, TWO_32, 0, TWO_32 + 8, 4096], [0, TWO_32 - 4096, 0, TWO_32 + 8 - 4096, 4096]])).runs
    expect(rows(merged)).toEqual([[0, TWO_32 - 4096, 0, TWO_32 + 8 - 4096, 8192]])
    const apart = coalesceRuns(columns([[0, TWO_32 - 4096, 0, TWO_32 - 4096, 4096], [0, TWO_32 + 1, 0, TWO_32, 4096]])).runs
    expect(apart.count).toBe(2)
  })

  it('merges shuffled neighbours that end at 2^53 - 1 (remote order by comparator: packed keys would not be exact there)', () => {
    const b = MAX - 3 * 1000
    const { runs, order } = coalesceRuns(columns([[0, b + 2000, 0, b + 2000, 1000], [0, b, 0, b, 1000], [0, b + 1000, 0, b + 1000, 1000]]))
    expect([...order!]).toEqual([1, 2, 0])
    expect(rows(runs)).toEqual([[0, b, 0, b, 3000]])
  })

  it('orders blocks right on both sides of the packed-key bound ((largest offset + 1) x blocks < 2^53)', () => {
    // 3 blocks: packed keys (offset x 3 + index) are exact while the span x 3 < 2^53.
    const below = Math.floor((TWO_53 - 1) / 3) // span x 3 <= 2^53 - 1: packed
    for (const top of [below - 1, below, below + 1, MAX - 1]) {
      const cols = columns([[0, 0, 0, top, 1], [0, 1, 0, 5, 1], [0, 2, 0, top - 1, 1]])
      expect([...remoteOrderIndexes(cols)], `largest offset ${top}`).toEqual([1, 2, 0])
    }
  })
})

describe('the work requests\' fields: raddr split into 32-bit halves, addresses and lengths', () => {
  function plan(op: TransferOp, blocks: Block[] | BlockArrays, local: LocalTable, remote: RemoteTable, sliceBytes = 65536, qps = 2) {
    return checkBlocks(op, blocks, local, remote, sliceBytes, qps)
  }

  interface Wr { wrId: number; opcode: number; flags: number; laddr: number; length: number; lkey: number; raddrLo: number; raddrHi: number; rkey: number }
  /** The work requests encodeSlices() makes of all the plan's slices (lane 0, rail 0), as the QP's encoder would receive them. */
  function wire(p: CheckedPlan, lane = 0, signalLast = true): Wr[] {
    const wrs: Wr[] = []
    const enc = {
      addOne(wrId: number, opcode: number, flags: number, laddr: number, length: number, lkey: number, raddrLo: number, raddrHi: number, rkey: number) {
        wrs.push({ wrId, opcode, flags, laddr, length, lkey, raddrLo, raddrHi, rkey })
        return wrs.length
      },
    }
    encodeSlices(enc, 100, p, 0, p.slices.count, 0, lane, signalLast)
    return wrs
  }

  it('carries the remote address past 2^32 into the high half, slice by slice', () => {
    // The segment starts 4 KiB below a 2^32 boundary of the address space; the block crosses it.
    const base = 0x1_ffff_f000n
    const p = plan('write', [{ local: ['kv', TWO_32 - 8192], remote: ['pool', 0], length: 3 * 4096 }], localTable(TWO_32 + 4096), remoteTable(TWO_32, base), 4096)
    expect(p.slices.count).toBe(3)
    const wrs = wire(p)
    expect(wrs.map((w) => w.raddrHi)).toEqual([1, 2, 2])
    expect(wrs.map((w) => w.raddrLo)).toEqual([0xffff_f000, 0, 0x1000])
    expect(wrs.map((w) => w.rkey)).toEqual([0xabcd, 0xabcd, 0xabcd])
    expect(wrs.map((w) => w.lkey)).toEqual([0x1234, 0x1234, 0x1234])
    expect(wrs.map((w) => w.laddr)).toEqual([0x7f00_0000_0000 + TWO_32 - 8192, 0x7f00_0000_0000 + TWO_32 - 4096, 0x7f00_0000_0000 + TWO_32])
    // Ids from the first given, one opcode (RDMA WRITE: 0), the last request signaled (IBV_SEND_SIGNALED: 2) unless a notice follows.
    expect(wrs.map((w) => w.wrId)).toEqual([100, 101, 102])
    expect(wrs.map((w) => w.opcode)).toEqual([0, 0, 0])
    expect(wrs.map((w) => w.flags)).toEqual([0, 0, 2])
    expect(wire(p, 0, false).map((w) => w.flags)).toEqual([0, 0, 0])
    for (let i = 0; i < 3; i++) {
      expect(BigInt(wrs[i]!.raddrHi) * 2n ** 32n + BigInt(wrs[i]!.raddrLo)).toBe(base + BigInt(i * 4096))
      expect(wrs[i]!.length).toBe(4096)
    }
  })

  it('a per-peer grant: each lane (data QP) sends its own key for the segment', () => {
    const remote = new RemoteTable()
    remote.add([['pool', '0x1000', 0xabcd, 1 << 20, 'read-write', [0x11, 0x22, 0x33]]], 1, 3)
    const p = plan('write', [{ local: ['kv', 0], remote: ['pool', 0], length: 4096 }, { local: ['kv', 8192], remote: ['pool', 8192], length: 4096 }], localTable(1 << 20), remote, 65536, 1)
    for (const [lane, key] of [[0, 0x11], [1, 0x22], [2, 0x33]] as const) expect(wire(p, lane).map((w) => w.rkey), `lane ${lane}`).toEqual([key, key])
  })

  it('offsets past 2^32 in a segment: raddr = the segment\'s address + offset, exactly, to the last byte below 2^64', () => {
    const cases: Array<[bigint, number, number]> = [ // segment address, segment length, block offset
      [0x7f12_3456_7000n, 5 * 2 ** 30, TWO_32 + 12345],
      [0x0n, 2 ** 40, 2 ** 40 - 4096],
      [2n ** 64n - 2n ** 33n, 2 ** 33, 2 ** 33 - 4096], // a region that ends at 2^64
      [2n ** 64n - BigInt(MAX), MAX, MAX - 4096], // 2^53 - 1 bytes that end at 2^64
    ]
    for (const [addr, length, offset] of cases) {
      const p = plan('read', { local: 'kv', remote: 'pool', localOffsets: [0], remoteOffsets: [offset], blockSize: 4096 }, localTable(4096), remoteTable(length, addr))
      const [wr] = wire(p)
      const raddr = BigInt(wr!.raddrHi) * 2n ** 32n + BigInt(wr!.raddrLo)
      expect(raddr, `${addr} + ${offset}`).toBe(addr + BigInt(offset))
      expect(wr!.raddrHi).toBeLessThanOrEqual(0xffff_ffff)
      expect(wr!.opcode).toBe(4) // RDMA READ
    }
  })

  it('a peer\'s segment that would end past 2^64 is refused when its table entry arrives (ERR_OUT_OF_RANGE): no raddr can wrap', () => {
    expect(code(() => remoteTable(2 ** 33 + 1, 2n ** 64n - 2n ** 33n))).toBe('ERR_OUT_OF_RANGE')
  })

  it('keeps the lengths and the total: blocks over 4 GiB, BlockArrays and Block[] alike', () => {
    const local = localTable(3 * TWO_32)
    const remote = remoteTable(3 * TWO_32, 0x10_0000_0000n)
    const arrays = plan('write', { local: 'kv', remote: 'pool', localOffsets: [0, TWO_32 + 1], remoteOffsets: [2 * TWO_32, 0], blockSize: TWO_32 - 1 }, local, remote, 2 ** 31)
    const list = plan('write', [{ local: ['kv', 0], remote: ['pool', 2 * TWO_32], length: TWO_32 - 1 }, { local: ['kv', TWO_32 + 1], remote: ['pool', 0], length: TWO_32 - 1 }], local, remote, 2 ** 31)
    for (const p of [arrays, list]) {
      expect(p.bytes).toBe(2 * (TWO_32 - 1))
      expect(p.blocks).toBe(2)
      expect(rows(p.slices).map((r) => r[4])).toEqual([2 ** 31, 2 ** 31 - 1, 2 ** 31, 2 ** 31 - 1]) // remote order: block 1 first
      expect(rows(p.slices).map((r) => r[3])).toEqual([0, 2 ** 31, 2 * TWO_32, 2 * TWO_32 + 2 ** 31])
    }
  })

  it('refuses blocks outside the tables with ERR_BLOCK_RANGE, in both forms, at 2^32 and 2^53', () => {
    const local = localTable(TWO_32)
    const remote = remoteTable(MAX, 0n)
    expect(code(() => plan('write', [{ local: ['kv', TWO_32 - 4095], remote: ['pool', 0], length: 4096 }], local, remote))).toBe('ERR_BLOCK_RANGE')
    expect(code(() => plan('write', [{ local: ['kv', 0], remote: ['pool', MAX - 4095], length: 4096 }], local, remote))).toBe('ERR_BLOCK_RANGE')
    expect(code(() => plan('write', { local: 'kv', remote: 'pool', localOffsets: [0], remoteOffsets: [TWO_53], blockSize: 1 }, local, remote))).toBe('ERR_BLOCK_RANGE')
    expect(code(() => plan('write', { local: 'kv', remote: 'pool', localOffsets: [0], remoteOffsets: [0], blockSize: TWO_32 + 1 }, local, remote))).toBe('ERR_BLOCK_RANGE')
    expect(code(() => plan('write', [{ local: ['kv', 0], remote: ['pool', 0, 1], length: 1 } as unknown as Block], local, remote))).toBe('ERR_INVALID_ARG_TYPE')
  })
})

/** JS heap bytes one call of `fn` allocates below lib/transfer's frames, garbage included (after `warm` calls under the profiler; the least of 3; a sample per 512 bytes on average). */
// 8 warm calls: under the profiler V8 may drop and recompile the loops a few times (feedback still arriving) first.
function allocatedByPlanning(fn: () => unknown, warm = 8): number {
  const session = new Session()
  session.connect()
  const post = (method: string, params?: object): { profile: { head: Node } } => {
    let out: unknown
    let err: Error | null = null
    session.post(method, params, (e, r) => { err = e; out = r })
    if (err) throw err
    return out as { profile: { head: Node } }
  }
  interface Node { selfSize: number; callFrame: { url: string }; children: Node[] }
  const total = (): number => {
    let bytes = 0
    const walk = (node: Node, inPlan: boolean): void => {
      inPlan ||= node.callFrame.url.includes('/lib/transfer/')
      if (inPlan) bytes += node.selfSize
      for (const child of node.children) walk(child, inPlan)
    }
    walk(post('HeapProfiler.getSamplingProfile').profile.head, false)
    return bytes
  }
  try {
    post('HeapProfiler.enable')
    post('HeapProfiler.startSampling', { samplingInterval: 512, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true })
    for (let i = 0; i < warm; i++) fn() // starting the profiler deoptimizes what allocates: warm again under it
    // The least of 3 calls: what planning allocates by design shows in every call; optimized code that a
    // loaded machine's compiler thread delivers late (unoptimized code boxes numbers) in some only.
    let least = Infinity
    for (let i = 0; i < 3; i++) {
      const before = total()
      fn()
      least = Math.min(least, total() - before)
    }
    post('HeapProfiler.stopSampling')
    return least
  } finally {
    session.disconnect()
  }
}

describe('planning allocates no JS heap per block', () => {
  // An object per block is >= 16 bytes, a number boxed in a loop 12, a string
  // such as `blocks[${i}].local` ~40: 4 bytes per block is far below any of them
  // and far above what a plan allocates for its few columns (~0.1 B per block).
  const n = 100_000
  const offsets = (stride: number) => Float64Array.from({ length: n }, (_, i) => ((i * 7919) % n) * stride + TWO_32)
  const local = localTable(TWO_32 + n * 4096)
  const remote = remoteTable(TWO_32 + 2 * n * 4096, 0x7f00_0000_0000n)

  it('BlockArrays: 10^5 scattered blocks past 2^32', () => {
    const blocks: BlockArrays = { local: 'kv', remote: 'pool', localOffsets: offsets(4096), remoteOffsets: offsets(8192), blockSize: 4096 }
    const bytes = allocatedByPlanning(() => checkBlocks('write', blocks, local, remote, 65536, 2))
    expect(bytes / n).toBeLessThan(4)
  }, 120_000)

  it('Block[]: 10^5 scattered blocks past 2^32 (the list is the caller\'s; planning adds nothing per block)', () => {
    const lo = offsets(4096)
    const ro = offsets(8192)
    const blocks: Block[] = Array.from({ length: n }, (_, i) => ({ local: ['kv', lo[i]!], remote: ['pool', ro[i]!], length: 4096 }))
    const bytes = allocatedByPlanning(() => checkBlocks('write', blocks, local, remote, 65536, 2))
    expect(bytes / n).toBeLessThan(4)
  }, 120_000)

  it('planSlices alone: the columns it makes are typed arrays', () => {
    const cols = emptyColumns(n)
    cols.loff.set(offsets(4096))
    cols.roff.set(offsets(8192))
    cols.len.fill(4096)
    const bytes = allocatedByPlanning(() => planSlices(cols, 65536, 4, n * 4096))
    expect(bytes / n).toBeLessThan(4)
  }, 120_000)
})

describe('a plan\'s shape is stable', () => {
  it('plans of one shape share one V8 map, however many are made (the run loads their fields on every batch)', () => {
    // A plan that was a spread of another object took a map of its own each
    // time once checkBlocks was optimized: every load of its fields in
    // run.ts and qp-lane.ts then missed V8's caches (~35k instructions per
    // 1-block write, bench/icount). %HaveSameMap needs the natives syntax,
    // turned on here before the function using it is compiled.
    setFlagsFromString('--allow-natives-syntax')
    // eslint-disable-next-line no-new-func
    const sameMap = new Function('a', 'b', 'return %HaveSameMap(a, b)') as (a: unknown, b: unknown) => boolean
    const local = localTable(1 << 20)
    const remote = remoteTable(1 << 20, 0x1_0000n)
    const blocks: Block[] = [{ local: ['kv', 0], remote: ['pool', 0], length: 4096 }]
    let last = checkBlocks('write', blocks, local, remote, 65536, 1)
    let changed = 0
    for (let i = 0; i < 20_000; i++) {
      const plan = checkBlocks('write', blocks, local, remote, 65536, 1)
      if (!sameMap(plan, last)) changed++
      last = plan
    }
    expect(changed, 'plans whose map differs from the last one\'s').toBeLessThan(10)
  })
})
