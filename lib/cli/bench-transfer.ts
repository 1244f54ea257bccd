// The transfer engine's benchmark, our side: two TransferAgents on one device
// (like perftest's server and client on one rxe device), or with transport
// 'tcp' two agents on loopback (and a plain node:net socket moving the same
// bytes as the baseline, bench-net.ts), a KV-cache-like
// layout (random, non-contiguous blocks on both sides), one timed transfer
// of many blocks per measurement, every block checked afterwards. Used by
// `node-ibverbs bench transfer` and by bench/transfer.mjs (which runs
// perftest in between).
import { randomFillSync } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import { listDevices, openDevice, TransferAgent, type BlockArrays, type Peer, type Segment } from '../index.js'
import { plainNetCopy, type NetCopyResult } from './bench-net.js'

/** perftest's MB: 2^20 bytes. */
const MB = 1 << 20

export interface TransferCase {
  op: 'write' | 'read'
  /** Blocks per transfer. */
  blocks: number
  /** Bytes per block. */
  blockSize: number
  /** Data QPs per peer (the initiating agent's qpsPerPeer). */
  qps: number
  /** Timed transfers (default 1); bandwidth is over all of them. */
  repeat?: number
  /** Bound on each transfer (default 600000 ms). */
  timeoutMs?: number
  /** Called with the bytes confirmed so far over all repeats, and their total (at most once per completed batch). */
  onProgress?: (done: number, total: number) => void
}

export interface TransferCaseResult {
  kind: 'transfer'
  transport: 'rdma' | 'tcp'
  op: 'write' | 'read'
  blocks: number
  blockSize: number
  qps: number
  bytes: number
  seconds: number
  /** MB/sec, MB = 2^20 bytes (as perftest). */
  mbPerSec: number
  /** CPU seconds (user + system) this process spent while the transfers ran: both agents' (TCP: both ends' work). */
  cpuSeconds: number
  /** Work requests of one transfer (after coalescing and slicing). */
  workRequests: number
  /** Time agent.prepare() takes for these blocks (checks, coalescing, slicing, striping), in ms: not in `seconds` (plan.run() is timed), but part of every write()/read(). */
  planMs: number
}

export interface NotifyLatencyResult {
  kind: 'notify-latency'
  /** Bytes per transfer, in `blocks` blocks. */
  size: number
  blocks: number
  iters: number
  /** Untimed writes ran this long first. */
  warmupMs: number
  /** µs from write() until the peer's 'notification' handler runs (the data is in place then): median, p99. */
  notifiedTypical: number
  notifiedP99: number
  /** µs from write() until its promise resolves: median, p99. */
  resolvedTypical: number
  resolvedP99: number
}

export interface NotifyLatencyOptions {
  /** Untimed notified writes first, for this long (default 5000; 0: timed from the first). */
  warmupMs?: number
  /** Blocks the bytes are split into (default 1). */
  blocks?: number
}

export interface TransferBenchOptions {
  /** 'rdma' (default) or 'tcp' (no device; host defaults to 127.0.0.1). */
  transport?: 'rdma' | 'tcp'
  /** Address of the device to listen on (default $SOFTROCE_ADDR, else the device's RoCE v2 IPv4 address; TCP: 127.0.0.1). */
  host?: string
  device?: string
  /** Largest bytes per transfer the bench will be asked to move (sizes the segments; default 64 MiB). */
  maxBytes?: number
  /** Engine settings passed to every agent. */
  sliceBytes?: number
  queueDepth?: number
  batchWrs?: number
  /** The data CQs' poll mode (RDMA; default 'event'). */
  pollMode?: 'event' | 'busy'
}

/** The IPv4 address of a device's RoCE v2 GID (rdma_cm needs one). */
function addressOf(deviceName: string | undefined): string {
  const device = openDevice(deviceName ?? listDevices()[0]?.name)
  try {
    const v4 = device.gids(1).find((g) => g.gid.startsWith('::ffff:'))
    if (!v4) throw new Error(`${device.name} has no IPv4 address for rdma_cm: pass --host`)
    return v4.gid.slice('::ffff:'.length)
  } finally {
    device.close()
  }
}

/** A small seeded generator (the layouts are random but repeatable): test/rdma/scale.ts uses it too. */
export function seededRandom(seed: number): () => number {
  let x = seed >>> 0 || 1
  return () => {
    x ^= x << 13; x >>>= 0
    x ^= x >>> 17
    x ^= x << 5; x >>>= 0
    return x / 2 ** 32
  }
}

/** The first `count` of a random permutation of 0..n-1. */
function randomSlots(n: number, count: number, next: () => number): Uint32Array {
  const all = new Uint32Array(n)
  for (let i = 0; i < n; i++) all[i] = i
  for (let i = 0; i < count; i++) {
    const j = i + Math.floor(next() * (n - i))
    const t = all[i]!; all[i] = all[j]!; all[j] = t
  }
  return all.subarray(0, count)
}

/**
 * Random non-contiguous blocks: the local side's blocks are its segment's
 * slots in random order; the remote side's are random slots of a pool twice
 * as large (a decode server's free KV blocks).
 */
export function kvLayout(blocks: number, blockSize: number, seed: number): { localOffsets: Float64Array; remoteOffsets: Float64Array } {
  const next = seededRandom(seed)
  const local = randomSlots(blocks, blocks, next)
  const remote = randomSlots(2 * blocks, blocks, next)
  const localOffsets = new Float64Array(blocks)
  const remoteOffsets = new Float64Array(blocks)
  for (let i = 0; i < blocks; i++) {
    localOffsets[i] = local[i]! * blockSize
    remoteOffsets[i] = remote[i]! * blockSize
  }
  return { localOffsets, remoteOffsets }
}

function quantile(sorted: Float64Array, q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!
}

interface Initiator { agent: TransferAgent; peer: Peer; kv: Segment }

/** Two agents on one device: a target with a pool, and an initiator per qpsPerPeer asked for. */
export class TransferBench {
  readonly #initiators = new Map<number, Initiator>()
  #seed = 1
  #notified: ((message: string) => void) | undefined

  private constructor(readonly host: string, readonly target: TransferAgent, readonly pool: Segment, readonly maxBytes: number, readonly options: TransferBenchOptions) {
    target.on('notification', ({ message }: { message: string | Buffer }) => this.#notified?.(String(message)))
    // A failed handshake or a lost peer on the target's side shows up as a failed transfer: say why.
    target.on('handshakeError', (error: Error) => console.error(`transfer bench: the target's handshake failed: ${error.message}`))
    target.on('peerLost', ({ error }: { error: Error }) => console.error(`transfer bench: the target lost a peer: ${error.message}`))
  }

  static async open(options: TransferBenchOptions = {}): Promise<TransferBench> {
    const tcp = options.transport === 'tcp'
    const deviceName = tcp ? undefined : options.device ?? process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE ?? undefined
    const host = options.host ?? (tcp ? '127.0.0.1' : process.env.SOFTROCE_ADDR ?? addressOf(deviceName))
    const maxBytes = options.maxBytes ?? 64 * MB
    // Handshakes get a minute: a loaded machine (or emulator) can take seconds per step.
    const target = await TransferAgent.create({ host, port: 0, name: 'target', handshakeTimeoutMs: 60_000, ...(deviceName ? { device: deviceName } : {}), ...engine(options) })
    try {
      const pool = target.register('pool', { size: 2 * maxBytes, remote: 'read-write' })
      return new TransferBench(host, target, pool, maxBytes, options)
    } catch (error) {
      target.close()
      throw error
    }
  }

  async #initiator(qps: number): Promise<Initiator> {
    let it = this.#initiators.get(qps)
    if (!it) {
      const o = this.options
      const device = o.transport === 'tcp' ? undefined : o.device ?? process.env.SOFTROCE_DEVICE ?? process.env.NODE_IBVERBS_DEVICE
      const agent = await TransferAgent.create({ host: this.host, port: 0, name: `initiator-${qps}`, qpsPerPeer: qps, handshakeTimeoutMs: 60_000, ...(device ? { device } : {}), ...engine(o) })
      try {
        const kv = agent.register('kv', { size: this.maxBytes })
        const peer = await agent.connect({ host: this.host, port: this.target.port, timeoutMs: 60_000 })
        it = { agent, peer, kv }
        this.#initiators.set(qps, it)
      } catch (error) {
        agent.close()
        throw error
      }
    }
    return it
  }

  /** Moves c.blocks random blocks of c.blockSize bytes, c.repeat times; checks every block. */
  async run(c: TransferCase): Promise<TransferCaseResult> {
    const bytes = c.blocks * c.blockSize
    if (bytes > this.maxBytes) throw new RangeError(`${c.blocks} x ${c.blockSize} B is more than the ${this.maxBytes} B this bench was opened for`)
    const { agent, peer, kv } = await this.#initiator(c.qps)
    const layout = kvLayout(c.blocks, c.blockSize, this.#seed++)
    const blocks: BlockArrays = { local: kv, remote: 'pool', ...layout, blockSize: c.blockSize }
    // Fresh random source bytes: what was there from an earlier case cannot pass the check.
    const [source, sourceOffsets] = c.op === 'write' ? [kv.bytes, layout.localOffsets] : [this.pool.bytes, layout.remoteOffsets]
    for (const offset of sourceOffsets) randomFillSync(source, offset, c.blockSize)

    const repeat = c.repeat ?? 1
    let workRequests = 0
    // Checked and planned once (timed alone: what write()/read() adds to run()), then run: perftest builds its work requests before its clock starts too.
    const p0 = performance.now()
    const plan = agent.prepare(peer, c.op, blocks)
    const planMs = performance.now() - p0
    const cpu0 = process.cpuUsage()
    const t0 = performance.now()
    const progress = c.onProgress
    for (let i = 0; i < repeat; i++) {
      const before = i * bytes
      const result = await plan.run({ timeoutMs: c.timeoutMs ?? 600_000, ...(progress ? { onProgress: (confirmed: number) => progress(before + confirmed, bytes * repeat) } : {}) })
      workRequests = result.workRequests
    }
    const seconds = (performance.now() - t0) / 1000
    const cpu = process.cpuUsage(cpu0)
    this.#check(kv, layout, c.blockSize)
    return { kind: 'transfer', transport: agent.transport, op: c.op, blocks: c.blocks, blockSize: c.blockSize, qps: c.qps, bytes, seconds, mbPerSec: (bytes * repeat) / seconds / MB, cpuSeconds: (cpu.user + cpu.system) / 1e6, workRequests, planMs }
  }

  /** Throws unless every block is the same on both sides. */
  #check(kv: Segment, layout: { localOffsets: Float64Array; remoteOffsets: Float64Array }, blockSize: number): void {
    const here = Buffer.from(kv.bytes.buffer, kv.bytes.byteOffset, kv.bytes.byteLength)
    const there = this.pool.bytes
    for (let i = 0; i < layout.localOffsets.length; i++) {
      const l = layout.localOffsets[i]!, r = layout.remoteOffsets[i]!
      if (here.compare(there, r, r + blockSize, l, l + blockSize) !== 0) throw new Error(`block ${i} (local ${l}, remote ${r}) differs after the transfer`)
    }
  }

  /**
   * Latency of a notified write of `size` bytes in `blocks` blocks, one at a
   * time: from the call until the peer's handler runs (and finds the data),
   * and until the promise resolves. Initiator with 1 QP. Untimed writes run
   * for `warmupMs` first (default 5 s, as the CLI's other benches: V8
   * optimizes the path over the first seconds, and a few hundred writes
   * measure the interpreter), then `iters` are timed.
   */
  async notifyLatency(size: number, iters: number, options: NotifyLatencyOptions = {}): Promise<NotifyLatencyResult> {
    const warmupMs = options.warmupMs ?? 5000
    const blocks = options.blocks ?? 1
    const { agent, peer, kv } = await this.#initiator(1)
    // `blocks` blocks of size / blocks bytes, a gap between them (none coalesces); the last byte of the last one is checked.
    const blockSize = Math.floor(size / blocks)
    const block = Array.from({ length: blocks }, (_, i) => ({ local: [kv, 2 * i * blockSize] as const, remote: ['pool', 2 * i * blockSize] as const, length: blockSize }))
    const lastByte = 2 * (blocks - 1) * blockSize + blockSize - 1
    let i = 0
    /** One notified write, checked: its times (µs) from the call until it resolved and until the handler ran. */
    const once = async (): Promise<{ resolved: number; notified: number }> => {
      const n = i++
      const seq = (n % 255) + 1
      kv.bytes[lastByte] = seq
      const arrived = new Promise<number>((resolve, reject) => {
        this.#notified = (message) => {
          if (message !== String(n)) return reject(new Error(`notification ${message}, expected ${n}`))
          if (this.pool.bytes[lastByte] !== seq) return reject(new Error(`notification ${n} came before its data`))
          resolve(performance.now())
        }
      })
      const t0 = performance.now()
      await agent.write(peer, block, { notify: String(n), timeoutMs: 60_000 })
      const t1 = performance.now()
      const t2 = await arrived
      return { resolved: (t1 - t0) * 1000, notified: (t2 - t0) * 1000 }
    }
    const warmEnd = performance.now() + warmupMs
    while (performance.now() < warmEnd) await once()
    const notified = new Float64Array(iters)
    const resolved = new Float64Array(iters)
    for (let k = 0; k < iters; k++) {
      const t = await once()
      resolved[k] = t.resolved
      notified[k] = t.notified
    }
    this.#notified = undefined
    notified.sort()
    resolved.sort()
    return {
      kind: 'notify-latency', size, blocks, iters, warmupMs,
      notifiedTypical: quantile(notified, 0.5), notifiedP99: quantile(notified, 0.99),
      resolvedTypical: quantile(resolved, 0.5), resolvedP99: quantile(resolved, 0.99),
    }
  }

  /** The baseline of a TCP case: a plain node:net socket moving the same blocks' bytes (writes: here to there; reads: there to here). */
  async plainNet(c: TransferCase): Promise<NetCopyResult> {
    const bytes = c.blocks * c.blockSize
    if (bytes > this.maxBytes) throw new RangeError(`${c.blocks} x ${c.blockSize} B is more than the ${this.maxBytes} B this bench was opened for`)
    const { kv } = await this.#initiator(c.qps)
    const layout = kvLayout(c.blocks, c.blockSize, this.#seed++)
    const [source, target, from, to] = c.op === 'write' ? [kv.bytes, this.pool.bytes, layout.localOffsets, layout.remoteOffsets] : [this.pool.bytes, kv.bytes, layout.remoteOffsets, layout.localOffsets]
    for (const offset of from) randomFillSync(source, offset, c.blockSize)
    const result = await plainNetCopy(source, target, from, to, c.blockSize, c.repeat ?? 1)
    this.#check(kv, layout, c.blockSize)
    return result
  }

  close(): void {
    for (const { agent } of this.#initiators.values()) agent.close()
    this.#initiators.clear()
    this.target.close()
  }
}

function engine(o: TransferBenchOptions): { transport?: 'rdma' | 'tcp'; sliceBytes?: number; queueDepth?: number; batchWrs?: number; pollMode?: 'event' | 'busy' } {
  return {
    ...(o.pollMode !== undefined ? { pollMode: o.pollMode } : {}),
    ...(o.transport !== undefined ? { transport: o.transport } : {}),
    ...(o.sliceBytes !== undefined ? { sliceBytes: o.sliceBytes } : {}),
    ...(o.queueDepth !== undefined ? { queueDepth: o.queueDepth } : {}),
    ...(o.batchWrs !== undefined ? { batchWrs: o.batchWrs } : {}),
  }
}
