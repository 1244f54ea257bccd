// The lower-level completion path of a QP: RDMA WRITEs and READs posted with a
// numeric tag and no promise, each reported once to the QP's completion
// handler. Bookkeeping per request is a ring slot (region held, tag), indexed
// by the request's sequence number, which its wr_id carries: no object is
// allocated per request. Promises stay the default; this path is for code
// that counts instructions per operation (docs/api.md, "Tagged operations").
import { RdmaError } from '../core/errors.js'
import { WrOpcode } from '../core/constants.js'
import { completionError, type CompletionEntry } from './pending.js'
import type { MemoryRegion } from '../verbs/memory.js'
import { RequestRing, type RingOwner } from './request-ring.js'

/** The verbs a tagged request can be, by the index its ring slot keeps; the indexes; each one's opcode. */
export const TAGGED_VERBS = ['write', 'read', 'fetchAndAdd', 'compareAndSwap'] as const
export const TAGGED_WRITE = 0
export const TAGGED_READ = 1
export const TAGGED_FETCH_ADD = 2
export const TAGGED_CMP_SWAP = 3
export const TAGGED_OPCODES = [WrOpcode.RdmaWrite, WrOpcode.RdmaRead, WrOpcode.AtomicFetchAndAdd, WrOpcode.AtomicCmpAndSwp]

/** Called once per tagged request: `error` is undefined when it succeeded. */
export type CompletionHandler = (tag: number, error: RdmaError | undefined) => void

/**
 * True while a CQ dispatches what a post found by polling right after posting
 * (the device often completes a request inside the post call). Handlers never
 * run inside a post: such reports are held until the end of the current
 * microtask checkpoint (one microtask for all of them), or until the next
 * explicit cq.poll(), whichever comes first.
 */
export const afterPost = { dispatching: false }

const RESOLVED = Promise.resolve()

// The held reports, in order, for every QP; and a spare set to swap in while
// they are delivered (a handler's own post holds its reports there). Emptied
// by count, never by length = 0, which frees the storage.
let heldOps: TaggedOps[] = []
let heldTags: number[] = []
let heldErrors: Array<RdmaError | undefined> = []
let spareOps: TaggedOps[] = []
let spareTags: number[] = []
let spareErrors: Array<RdmaError | undefined> = []
let held = 0
let flushScheduled = false

function hold(ops: TaggedOps, tag: number, error: RdmaError | undefined): void {
  heldOps[held] = ops
  heldTags[held] = tag
  heldErrors[held] = error
  held++
  if (!flushScheduled) {
    flushScheduled = true
    void RESOLVED.then(deliverHeld)
  }
}

/** Reports held back by posts, delivered now (from a microtask, or from an explicit cq.poll()). */
export function deliverHeld(): void {
  flushScheduled = false
  const count = held
  if (count === 0) return
  const ops = heldOps
  const tags = heldTags
  const errors = heldErrors
  heldOps = spareOps
  heldTags = spareTags
  heldErrors = spareErrors
  spareOps = ops
  spareTags = tags
  spareErrors = errors
  held = 0
  for (let i = 0; i < count; i++) {
    const owner = ops[i]!
    const error = errors[i]
    errors[i] = undefined
    try {
      owner.handler(tags[i]!, error)
    } catch (thrown) {
      // As from the event loop: an uncaught exception. The other reports are still delivered.
      queueMicrotask(() => { throw thrown })
    }
  }
}

/** Whether posts hold reports not yet delivered (cq.poll() then delivers them). */
export function reportsHeld(): boolean {
  return held !== 0
}

/** Tagged requests carry wr_ids from here up (the promises' fast path from PROMISE_WR_ID_BASE, other promise requests count up from 1). */
export const TAGGED_WR_ID_BASE = 2 ** 52

export class TaggedOps extends RequestRing {
  readonly #tags: Uint32Array
  #collected: number[] = []

  constructor(owner: RingOwner, public handler: CompletionHandler, capacity: number) {
    super(owner, capacity, TAGGED_WR_ID_BASE)
    this.#tags = new Uint32Array(this.mask + 1)
  }

  /** Records a request about to be posted (RequestRing.claim()); returns its wr_id. */
  add(region: MemoryRegion, tag: number, verb: number): number {
    const seq = this.claim(region, verb)
    this.#tags[seq & this.mask] = tag
    return TAGGED_WR_ID_BASE + seq
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
    if (afterPost.dispatching) hold(this, tag, error)
    else this.handler(tag, error)
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
    queueMicrotask(() => { for (const tag of tags) handler(tag, error) })
  }
}

export function handlerBusy(inFlight: number): RdmaError {
  return new RdmaError(`The completion handler cannot change while ${inFlight} tagged requests are in flight`, { code: 'ERR_BUSY' })
}
