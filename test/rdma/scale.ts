// The scale run of the transfer engine (test/rdma/105): one write() and one
// read() of many scattered blocks between segments larger than 4 GiB, with
// blocks on both sides past 2^32, every byte of every block checked against
// what it must hold. The layout and the byte patterns are here; 105 picks the
// size (small in `npm test`, > 4 GiB in `npm run test:scale`).
import { randomFillSync } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { performance } from 'node:perf_hooks'
import { NativeMemory, TransferAgent, type BlockArrays, type Peer } from '../../dist/index.js'
import { seededRandom } from '../../dist/cli/bench-transfer.js'

export const KiB = 2 ** 10
export const MiB = 2 ** 20
export const GiB = 2 ** 30
export const TWO_32 = 2 ** 32

/** Where a side's blocks go: `count` slots of the block size from byte `base` of its memory. */
export interface SlotRange { base: number; count: number }

export interface ScaleConfig {
  blocks: number
  blockSize: number
  /** Bytes of the initiators' memory (registered as segment 'kv' by each of them). */
  localBytes: number
  /** Bytes of the target's memory (segment 'pool'); 'shared': the target registers the initiators' memory. */
  remoteBytes: number | 'shared'
  local: SlotRange
  remote: SlotRange
  /** The first `run` blocks are contiguous on both sides (coalesced into one run, then sliced), around 2^32 locally. */
  run: number
  /** Data QPs per peer: one initiator agent each. */
  qps: readonly number[]
}

/** A field of /proc/meminfo in bytes: the guest's (or host's) memory. */
export function meminfo(field: 'MemTotal' | 'MemAvailable'): number {
  const line = readFileSync('/proc/meminfo', 'utf8').split('\n').find((l) => l.startsWith(`${field}:`))!
  return Number(line.split(/\s+/)[1]) * 1024
}

/**
 * `blocks` distinct slots of `range` as byte offsets, in random order, except
 * that the first `run` are the slots from `runSlot` on, in order.
 */
function slots(range: SlotRange, blockSize: number, blocks: number, run: number, runSlot: number, next: () => number): Float64Array {
  if (blocks > range.count || runSlot < 0 || runSlot + run > range.count) throw new RangeError('the slot range is too small for the blocks')
  const all = new Uint32Array(range.count)
  for (let i = 0; i < range.count; i++) all[i] = i
  // The run's slots to the front (in order), then a partial Fisher-Yates over the rest.
  for (let k = 0; k < run; k++) {
    const at = all.indexOf(runSlot + k, k)
    all[at] = all[k]!
    all[k] = runSlot + k
  }
  for (let i = run; i < blocks; i++) {
    const j = i + Math.floor(next() * (range.count - i))
    const t = all[i]!; all[i] = all[j]!; all[j] = t
  }
  const offsets = new Float64Array(blocks)
  for (let i = 0; i < blocks; i++) offsets[i] = range.base + all[i]! * blockSize
  return offsets
}

/** The blocks' offsets on both sides. */
export function scaleLayout(c: ScaleConfig, seed = 26): { localOffsets: Float64Array; remoteOffsets: Float64Array } {
  const next = seededRandom(seed)
  // Locally the run straddles 2^32 when the range does; remotely it starts at a random slot.
  const localRunSlot = Math.max(0, Math.min(c.local.count - c.run, Math.floor((TWO_32 - c.local.base) / c.blockSize) - (c.run >> 1)))
  const remoteRunSlot = Math.floor(next() * (c.remote.count - c.run))
  return {
    localOffsets: slots(c.local, c.blockSize, c.blocks, c.run, localRunSlot, next),
    remoteOffsets: slots(c.remote, c.blockSize, c.blocks, c.run, remoteRunSlot, next),
  }
}

/**
 * What block `index` holds in the phase of `seed`: bytes of a random source
 * taken from a place that depends on both, with index and seed at both ends.
 * Every block differs from every other and from itself in another phase, so a
 * block that lands in the wrong place, or not at all, fails the check.
 */
export class Patterns {
  readonly #noise: Uint8Array
  readonly #scratch: Uint8Array
  constructor(readonly blockSize: number) {
    this.#noise = randomFillSync(new Uint8Array(MiB + blockSize))
    this.#scratch = new Uint8Array(blockSize)
  }

  write(view: Uint8Array, index: number, seed: number): void {
    const from = ((index * 4099 + seed * 7919) * 8) % MiB
    view.set(this.#noise.subarray(from, from + this.blockSize))
    const words = new DataView(view.buffer, view.byteOffset, view.byteLength)
    words.setUint32(0, index, true)
    words.setUint32(4, seed, true)
    words.setUint32(this.blockSize - 8, index, true)
    words.setUint32(this.blockSize - 4, seed, true)
  }

  /** Whether `view` holds exactly block `index` of `seed` (every byte compared). */
  matches(view: Uint8Array, index: number, seed: number): boolean {
    this.write(this.#scratch, index, seed)
    return Buffer.compare(view, this.#scratch) === 0
  }
}

/** A view of `length` bytes at `offset` (NativeMemory over 4 GiB has windows only). */
export const windowOf = (memory: NativeMemory, offset: number, length: number): Uint8Array => memory.window(offset, length)

/** Writes block i of `seed` at offsets[i] of `memory`, for every block. */
export function fillBlocks(p: Patterns, memory: NativeMemory, offsets: Float64Array, seed: number): void {
  for (let i = 0; i < offsets.length; i++) p.write(windowOf(memory, offsets[i]!, p.blockSize), i, seed)
}

/** The blocks that do not hold what they must: count and the first few indexes. */
export function badBlocks(p: Patterns, memory: NativeMemory, offsets: Float64Array, seed: number): { count: number; first: number[] } {
  const first: number[] = []
  let count = 0
  for (let i = 0; i < offsets.length; i++) {
    if (!p.matches(windowOf(memory, offsets[i]!, p.blockSize), i, seed)) {
      count++
      if (first.length < 8) first.push(i)
    }
  }
  return { count, first }
}

export interface ScaleSide { agent: TransferAgent; peer: Peer; qps: number }

/** A target agent with the pool and one initiator agent per QP count, each with the local memory as 'kv', connected. */
export class ScaleRig {
  readonly patterns: Patterns
  readonly layout: { localOffsets: Float64Array; remoteOffsets: Float64Array }
  readonly sides: ScaleSide[] = []
  /** ms each registration took (pinning GiBs is not free in the guest). */
  readonly registerMs: number[] = []

  private constructor(readonly config: ScaleConfig, readonly host: string, readonly target: TransferAgent, readonly localMemory: NativeMemory, readonly remoteMemory: NativeMemory) {
    this.patterns = new Patterns(config.blockSize)
    this.layout = scaleLayout(config)
  }

  static async open(c: ScaleConfig, host: string): Promise<ScaleRig> {
    const localMemory = new NativeMemory(c.localBytes)
    const remoteMemory = c.remoteBytes === 'shared' ? localMemory : new NativeMemory(c.remoteBytes)
    const target = await TransferAgent.create({ host, port: 0, name: 'scale-target', handshakeTimeoutMs: 60_000 })
    const rig = new ScaleRig(c, host, target, localMemory, remoteMemory)
    try {
      rig.#timed(() => target.register('pool', { memory: remoteMemory, remote: 'read-write' }))
      for (const qps of c.qps) {
        const agent = await TransferAgent.create({ host, port: 0, name: `scale-initiator-${qps}`, qpsPerPeer: qps, handshakeTimeoutMs: 60_000 })
        rig.sides.push({ agent, peer: undefined as unknown as Peer, qps })
        rig.#timed(() => agent.register('kv', { memory: localMemory }))
        rig.sides[rig.sides.length - 1]!.peer = await agent.connect({ host, port: target.port, timeoutMs: 60_000 })
      }
      return rig
    } catch (error) {
      await rig.close()
      throw error
    }
  }

  #timed(register: () => unknown): void {
    const t = performance.now()
    register()
    this.registerMs.push(Math.round(performance.now() - t))
  }

  blocks(): BlockArrays {
    return { local: 'kv', remote: 'pool', ...this.layout, blockSize: this.config.blockSize }
  }

  get bytes(): number { return this.config.blocks * this.config.blockSize }

  /**
   * One write() (op 'write': local blocks to the pool) or read() (pool to local
   * blocks) of every block on `side`, with fresh patterns in the source and every
   * destination block checked afterwards.
   */
  async move(side: ScaleSide, op: 'write' | 'read', seed: number): Promise<ScaleResult> {
    const { localOffsets, remoteOffsets } = this.layout
    const [source, sourceOffsets, dest, destOffsets] = op === 'write'
      ? [this.localMemory, localOffsets, this.remoteMemory, remoteOffsets]
      : [this.remoteMemory, remoteOffsets, this.localMemory, localOffsets]
    let t = performance.now()
    fillBlocks(this.patterns, source, sourceOffsets, seed)
    const fillMs = performance.now() - t
    t = performance.now()
    const plan = side.agent.prepare(side.peer, op, this.blocks())
    const planMs = performance.now() - t
    t = performance.now()
    const result = op === 'write' ? await side.agent.write(side.peer, this.blocks()) : await side.agent.read(side.peer, this.blocks())
    const ms = performance.now() - t
    t = performance.now()
    const bad = badBlocks(this.patterns, dest, destOffsets, seed)
    const checkMs = performance.now() - t
    void plan
    return { op, qps: side.qps, bytes: result.bytes, blocks: result.blocks, workRequests: result.workRequests, ms, mibPerSec: result.bytes / MiB / (ms / 1000), planMs, fillMs, checkMs, bad }
  }

  async close(): Promise<void> {
    for (const side of this.sides) await side.agent.close()
    await this.target.close()
  }
}

export interface ScaleResult {
  op: 'write' | 'read'
  qps: number
  bytes: number
  blocks: number
  workRequests: number
  /** Wall time of the write() / read() call (planning included). */
  ms: number
  mibPerSec: number
  /** agent.prepare() of the same blocks alone. */
  planMs: number
  fillMs: number
  checkMs: number
  bad: { count: number; first: number[] }
}
