// The lower-level completion path of a QP: RDMA WRITEs and READs posted with a
// numeric tag and no promise, each reported once to the QP's completion
// handler. Bookkeeping per request is a ring slot (region held, tag), indexed
// by the request's sequence number, which its wr_id carries: no object is
// allocated per request. Promises stay the default; this path is for code
// that counts instructions per operation (docs/api.md, "Tagged operations").
import { RdmaError } from '../core/errors.js'
import { WrOpcode } from '../core/constants.js'
import { completionError, type CompletionEntry } from './pending.js'
import type { HeldRegion } from './held-region.js'
import { RequestRing, type RingOwner } from './request-ring.js'
import { TAGGED_WR_ID_BASE } from './wr-ids.js'
import { reportUncaught, type CompletionDispatch } from './dispatch.js'

/** The verbs a tagged request can be, by the index its ring slot keeps; the indexes; each one's opcode. */
export const TAGGED_VERBS = ['write', 'read', 'fetchAndAdd', 'compareAndSwap'] as const
export const TAGGED_WRITE = 0
export const TAGGED_READ = 1
export const TAGGED_FETCH_ADD = 2
export const TAGGED_CMP_SWAP = 3
export const TAGGED_OPCODES = [WrOpcode.RdmaWrite, WrOpcode.RdmaRead, WrOpcode.AtomicFetchAndAdd, WrOpcode.AtomicCmpAndSwp]

/** Called once per tagged request: `error` is undefined when it succeeded. */
export type CompletionHandler = (tag: number, error: RdmaError | undefined) => void

export class TaggedOps extends RequestRing {
  readonly #tags: Uint32Array
  #collected: number[] = []

  /** `dispatch`: of the CQ the requests complete on (the QP's send CQ), which holds reports found inside a post. */
  constructor(owner: RingOwner, public handler: CompletionHandler, capacity: number, readonly dispatch: Pick<CompletionDispatch, 'report'>) {
    super(owner, capacity, TAGGED_WR_ID_BASE)
    this.#tags = new Uint32Array(this.mask + 1)
  }

  /** Records a request about to be posted (RequestRing.claim()); returns its wr_id. */
  add(region: HeldRegion, tag: number, verb: number): number {
    const seq = this.claim(region, verb)
    this.#tags[seq & this.mask] = tag
    return this.wrIdBase + seq
  }

  /** CompletionQueue dispatch: the completion of a tagged request. */
  complete(entry: CompletionEntry): void {
    const slot = this.slotOf(entry.wrId)
    if (slot < 0) return
    const tag = this.#tags[slot]!
    const verb = TAGGED_VERBS[this.verbs[slot]!]!
    const reported = this.reported[slot] === 1
    this.release(slot)
    if (reported) return
    if (entry.status === 0) return this.#deliver(tag, undefined)
    const error = completionError(entry, verb)
    if (entry.status !== 5 /* WR_FLUSH_ERR */) this.owner.failed(error)
    this.#deliver(tag, error)
  }

  #deliver(tag: number, error: RdmaError | undefined): void {
    this.dispatch.report(this, tag, error)
  }

  protected collect(slot: number): void {
    this.#collected.push(this.#tags[slot]!)
  }

  /** A handler never runs inside close() or a CQ's failure: the reports go out in a microtask. */
  protected reportCollected(error: RdmaError): void {
    const tags = this.#collected
    if (tags.length === 0) return
    this.#collected = []
    const handler = this.handler
    queueMicrotask(() => {
      for (const tag of tags) {
        try {
          handler(tag, error)
        } catch (thrown) {
          reportUncaught(thrown) // as a dispatch does: the other reports still go out
        }
      }
    })
  }
}

export function handlerBusy(inFlight: number): RdmaError {
  return new RdmaError(`The completion handler cannot change while ${inFlight} tagged requests are in flight`, { code: 'ERR_BUSY' })
}
