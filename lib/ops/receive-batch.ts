// The receives of one recvMany() (a QP's or an SRQ's): one promise each,
// encoded and posted with one native call.
import { fromNative, type RdmaError } from '../core/errors.js'
import type { WaitOptions } from '../core/validate.js'
import type { WorkRequestEncoder, Sge } from './encoder.js'
import type { HeldRegion } from './held-region.js'
import { Pending, type CompletionEntry, type PendingCounter, type PendingOwner } from './pending.js'
import type { WrIdAllocator } from './wr-ids.js'

/** A receive buffer, checked: its SGEs and the regions it holds while posted. */
export interface ReceiveBuffer { sges: Sge[]; regions: HeldRegion | HeldRegion[] }

/** The receives of one recvMany() (a QP's or an SRQ's): one promise each, settled with a `T` made from the completion. */
export class ReceiveBatch<T> {
  readonly promises: Array<Promise<T>> = []
  readonly #resolves: Array<(completion: T) => void> = []
  readonly #rejects: Array<(error: Error) => void> = []

  constructor(readonly buffers: readonly ReceiveBuffer[]) {
    for (let i = 0; i < buffers.length; i++) {
      this.promises.push(new Promise((resolve, reject) => {
        this.#resolves.push(resolve)
        this.#rejects.push(reject)
      }))
    }
  }

  readonly rejectAll = (error: Error): void => { for (const reject of this.#rejects) reject(error) }

  /**
   * One Pending per buffer (of `owner`, counted by `counter`, ids from
   * `wrIds`), encoded with `encoder` and posted with one `postRecv` call;
   * `tracked` sees each before posting. A refusal rejects the receives that
   * did not reach the queue (the ones before stay posted).
   */
  post(owner: PendingOwner, counter: PendingCounter, wrIds: WrIdAllocator, encoder: WorkRequestEncoder, wait: WaitOptions,
    toCompletion: (entry: CompletionEntry) => T, postRecv: (words: Uint32Array, count: number) => void, tracked?: (pending: Pending) => void): void {
    const n = this.buffers.length
    const first = wrIds.take(n)
    const pendings: Pending[] = []
    encoder.reset()
    for (let i = 0; i < n; i++) {
      const pending = new Pending(owner, counter, 'recv', 'recv', first + i, first + i, this.buffers[i]!.regions,
        this.#resolves[i]!, this.#rejects[i]!, toCompletion)
      encoder.addRecv(first + i, this.buffers[i]!.sges)
      pending.track(wait)
      tracked?.(pending)
      pendings.push(pending)
    }
    try {
      postRecv(encoder.buffer, n)
    } catch (cause) {
      const error = fromNative(cause) as RdmaError
      for (const pending of pendings.slice(error.posted ?? 0)) {
        pending.untrack()
        pending.reject(error)
      }
    }
  }
}
