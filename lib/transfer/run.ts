// One run of a checked plan on a peer link: hands its slices to the link's
// QP posters, counts what completions confirm, and settles exactly once —
// done (after the notification, if any, is sent), or failed / timed out /
// aborted with the bytes known to have landed.
import { SendFlags, WrOpcode } from '../core/constants.js'
import { RdmaError } from '../core/errors.js'
import type { MemoryRegion } from '../verbs/memory.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { CheckedPlan } from './plan.js'
import type { PostedBatch, PostSource, QpPoster } from './poster.js'
import { codeOf, TransferError } from './transfer-error.js'

/** What a successful transfer resolves with. */
export interface TransferResult {
  /** Bytes moved. */
  bytes: number
  /** Blocks as given (before coalescing). */
  blocks: number
  /** Work requests posted (slices after coalescing and slicing). */
  workRequests: number
  /** QPs used. */
  qps: number
  ms: number
}

export interface RunHooks {
  peer: string
  /** Sends the notification (ordered per peer); resolves when the peer's device has it. */
  notify?: () => Promise<void>
  /** A batch failed and its QP is in the error state: the link is broken. */
  onBatchError(error: Error): void
  settled(run: TransferRun, error: Error | undefined, result: TransferResult | undefined): void
}

export class TransferRun implements PostSource {
  settled = false
  readonly #plan: CheckedPlan
  readonly #cursor: Uint32Array
  readonly #hooks: RunHooks
  readonly #started = performance.now()
  #landed = 0
  #slicesLeft: number
  #timer: NodeJS.Timeout | undefined
  #signal: AbortSignal | undefined
  readonly #onAbort = (): void => this.fail(new TransferError(`Transfer aborted after ${this.#landed} of ${this.#plan.bytes} bytes`, {
    code: 'ABORT_ERR', bytesLanded: this.#landed, bytes: this.#plan.bytes, peer: this.#hooks.peer, cause: this.#signal?.reason,
  }))

  constructor(plan: CheckedPlan, hooks: RunHooks) {
    this.#plan = plan
    this.#hooks = hooks
    this.#cursor = plan.bounds.slice(0, plan.bounds.length - 1)
    this.#slicesLeft = plan.slices.count
  }

  /** Queues the run on the posters, bounded by `timeoutMs` and `signal`. */
  start(posters: readonly QpPoster[], timeoutMs: number | undefined, signal: AbortSignal | undefined): void {
    if (signal?.aborted) { this.#signal = signal; return this.#onAbort() }
    if (timeoutMs !== undefined) {
      this.#timer = setTimeout(() => this.fail(new TransferError(`Transfer timed out after ${timeoutMs} ms with ${this.#landed} of ${this.#plan.bytes} bytes landed`, {
        code: 'ETIMEDOUT', bytesLanded: this.#landed, bytes: this.#plan.bytes, peer: this.#hooks.peer,
      })), timeoutMs)
    }
    if (signal) {
      this.#signal = signal
      signal.addEventListener('abort', this.#onAbort, { once: true })
    }
    for (const poster of posters) poster.add(this)
  }

  hasMore(q: number): boolean {
    return !this.settled && this.#cursor[q]! < this.#plan.bounds[q + 1]!
  }

  postNext(q: number, max: number, qp: QueuePair): PostedBatch {
    const { slices, wire, locals, remotes } = this.#plan
    const from = this.#cursor[q]!
    const to = Math.min(this.#plan.bounds[q + 1]!, from + max)
    if (to <= from) return { wrs: 0, bytes: 0, done: Promise.resolve() }
    this.#cursor[q] = to
    // The local regions the batch names (held until it completes); a segment
    // unregistered since the plan was checked refuses the batch, before any
    // of it is posted.
    const regions: MemoryRegion[] = []
    let lastLocal = -1
    let lastRemote = -1
    let bytes = 0
    for (let i = from; i < to; i++) {
      bytes += slices.len[i]!
      const l = slices.lseg[i]!
      if (l !== lastLocal) {
        lastLocal = l
        const segment = locals[l]!
        if (segment.withdrawn) throw new RdmaError(`Local segment '${segment.name}' was unregistered during the transfer`, { code: 'ERR_SEGMENT_WITHDRAWN' })
        if (!regions.includes(segment.region)) regions.push(segment.region)
      }
      const r = slices.rseg[i]!
      if (r !== lastRemote) {
        lastRemote = r
        const segment = remotes[r]!
        if (segment.withdrawn) throw new RdmaError(`The peer withdrew segment '${segment.name}' during the transfer`, { code: 'ERR_SEGMENT_WITHDRAWN' })
      }
    }
    const opcode = this.#plan.op === 'read' ? WrOpcode.RdmaRead : WrOpcode.RdmaWrite
    const done = qp.postEncoded(this.#plan.op, to - from, regions, (first, enc) => {
      const last = to - 1
      for (let i = from; i < to; i++) {
        enc.addOne(first + i - from, opcode, i === last ? SendFlags.Signaled : 0, wire.laddr[i]!, slices.len[i]!, wire.lkey[i]!,
          wire.raddrLo[i]!, wire.raddrHi[i]!, wire.rkey[i]!, 0)
      }
    })
    return { wrs: to - from, bytes, done }
  }

  batchDone(bytes: number, wrs: number): void {
    this.#landed += bytes
    this.#slicesLeft -= wrs
    if (this.#slicesLeft > 0 || this.settled) return
    const notify = this.#hooks.notify
    if (!notify) return this.#succeed()
    notify().then(() => this.#succeed(), (error: unknown) => this.fail(this.#failure(error, 'the notification could not be sent')))
  }

  batchFailed(error: Error, linkBroken: boolean): void {
    if (linkBroken) this.#hooks.onBatchError(error)
    this.fail(this.#failure(error, linkBroken ? 'a work request failed' : 'a batch was refused'))
  }

  /** Rejects with `error` unless settled already. */
  fail(error: Error): void {
    this.#settle(error, undefined)
  }

  /** A TransferError for a failure caused by `cause`. */
  failure(cause: unknown, why: string): TransferError {
    return this.#failure(cause, why)
  }

  #failure(cause: unknown, why: string): TransferError {
    const status = (cause as { status?: string })?.status
    return new TransferError(`Transfer failed (${why}: ${(cause as Error)?.message ?? cause}) with ${this.#landed} of ${this.#plan.bytes} bytes landed`, {
      code: codeOf(cause), bytesLanded: this.#landed, bytes: this.#plan.bytes, peer: this.#hooks.peer, cause, ...(status ? { status } : {}),
    })
  }

  #succeed(): void {
    const p = this.#plan
    this.#settle(undefined, { bytes: p.bytes, blocks: p.blocks, workRequests: p.slices.count, qps: p.qps, ms: performance.now() - this.#started })
  }

  #settle(error: Error | undefined, result: TransferResult | undefined): void {
    if (this.settled) return
    this.settled = true
    clearTimeout(this.#timer)
    this.#signal?.removeEventListener('abort', this.#onAbort)
    this.#hooks.settled(this, error, result)
  }
}
