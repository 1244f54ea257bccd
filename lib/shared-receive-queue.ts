// Shared receive queue: one pool of receive buffers for many QPs.
import { native, type NativeSharedReceiveQueue } from './native.js'
import { call, closedError, fromNative, RdmaError } from './errors.js'
import { Resource } from './resource.js'
import { abandonAll, allocateWrIds, Pending, type PendingOwner } from './pending.js'
import { WorkRequestEncoder } from './work-request-encoding.js'
import { integer, optionalObject, waitOptions, type WaitOptions } from './validate.js'
import type { ProtectionDomain } from './protection-domain.js'
import type { CompletionQueue } from './completion-queue.js'
import { localSges, receiveCompletion, type ReceiveCompletion } from './queue-pair.js'

const encoder = new WorkRequestEncoder()

export interface SharedReceiveQueueOptions { maxWr?: number; maxSge?: number }

export class SharedReceiveQueue extends Resource implements PendingOwner {
  protected readonly kind = 'SharedReceiveQueue'
  /** @internal */ readonly handle: NativeSharedReceiveQueue
  readonly pd: ProtectionDomain
  readonly maxWr: number
  readonly maxSge: number
  readonly qpn = 0
  #cq: CompletionQueue | undefined
  readonly #outstanding = new Set<Pending>()

  /** @internal use pd.createSrq() */
  constructor(pd: ProtectionDomain, options: SharedReceiveQueueOptions = {}) {
    super()
    const o = optionalObject(options, 'options')
    this.maxWr = integer(o.maxWr ?? 256, 'options.maxWr', 1, 1 << 20)
    this.maxSge = integer(o.maxSge ?? 1, 'options.maxSge', 1, 64)
    this.pd = pd
    this.handle = call(() => new native.SharedReceiveQueue(pd.handle, this.maxWr, this.maxSge, 0))
    this.kernelHandle = this.handle.handle
    pd.device.trackSrq(this)
    this.adoptedBy(pd)
  }

  /** @internal the kernel's handle, named by SRQ async events (kept: untracking runs after the handle is gone) */
  readonly kernelHandle: number

  /** @internal A QP that receives through this SRQ: its CQ keeps the loop alive for our receives. */
  attach(qp: { recvCq: CompletionQueue }): void {
    this.#cq ??= qp.recvCq
  }

  /** Posts a receive buffer shared by the attached QPs. */
  recv(local: unknown, options: WaitOptions = {}): Promise<ReceiveCompletion> {
    return new Promise((resolve, reject) => {
      try {
        this.assertOpen()
        const wait = waitOptions(options)
        const { sges, regions } = localSges(local, 'local', this.maxSge)
        const first = allocateWrIds(1)
        const pending = new Pending(this, this.#cq, 'recv', 'recv', first, first, regions, (entry) => resolve(receiveCompletion(entry)), reject)
        encoder.reset()
        encoder.addRecv(first, sges)
        pending.track(wait)
        this.#outstanding.add(pending)
        try {
          this.handle.postRecv(encoder.buffer, 1)
        } catch (cause) {
          pending.untrack()
          throw fromNative(cause)
        }
      } catch (error) {
        reject(error)
      }
    })
  }

  /** Raises the 'SRQ_LIMIT_REACHED' device event once fewer than `limit` receives remain. */
  arm(limit: number): void {
    this.assertOpen()
    integer(limit, 'limit', 1, this.maxWr)
    call(() => this.handle.arm(limit))
  }

  query(): { maxWr: number; maxSge: number; limit: number } {
    this.assertOpen()
    return call(() => this.handle.query())
  }

  /** @internal */
  released(pending: Pending): void { this.#outstanding.delete(pending) }
  /** @internal */
  failed(_error: RdmaError): void {}

  protected override afterClose(): void {
    this.pd.device.untrackSrq(this)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
    const error = closedError(this.kind)
    abandonAll(this.#outstanding, error)
  }
}
