// The lower-level completion path of a QP: RDMA WRITEs and READs posted with a
// numeric tag and no promise, each reported once to the QP's completion
// handler. Bookkeeping per request is a ring slot (region held, tag), indexed
// by the request's sequence number, which its wr_id carries: no object is
// allocated per request. Promises stay the default; this path is for code
// that counts instructions per operation (docs/api.md, "Tagged operations").
import { RdmaError } from './errors.js'
import { WrOpcode } from './constants.js'
import { completionError, type CompletionEntry } from './pending.js'
import type { MemoryRegion } from './memory.js'

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

/** Tagged requests carry wr_ids from here up (promise requests count up from 1). */
export const TAGGED_WR_ID_BASE = 2 ** 52

/** What the ring needs of its QP when a request finishes. */
export interface TaggedOwner {
  /** A slot of the send queue and a CQ credit are free again; the CQ has one request less waiting. */
  finishedTagged(): void
  /** An error completion moved the QP to the error state. */
  failed(error: RdmaError): void
}

export class TaggedOps {
  /** Requests in flight. */
  inFlight = 0
  readonly #mask: number
  readonly #regions: Array<MemoryRegion | undefined>
  readonly #tags: Uint32Array
  readonly #seqs: Float64Array
  readonly #verbs: Uint8Array // index into TAGGED_VERBS
  /** Already reported (the CQ failed): its completion or abandonment is not reported again. */
  readonly #reported: Uint8Array
  #next = 0

  constructor(readonly owner: TaggedOwner, public handler: CompletionHandler, capacity: number) {
    let size = 1
    while (size < capacity) size <<= 1
    this.#mask = size - 1
    this.#regions = new Array<MemoryRegion | undefined>(size).fill(undefined)
    this.#tags = new Uint32Array(size)
    this.#seqs = new Float64Array(size).fill(-1)
    this.#verbs = new Uint8Array(size)
    this.#reported = new Uint8Array(size)
  }

  /**
   * Records a request about to be posted (the caller took its send slot and
   * CQ credit, so at most `capacity` are in flight and slots never collide);
   * returns its wr_id.
   */
  add(region: MemoryRegion, tag: number, verb: number): number {
    const seq = this.#next++
    const slot = seq & this.#mask
    this.#regions[slot] = region
    this.#tags[slot] = tag
    this.#seqs[slot] = seq
    this.#verbs[slot] = verb
    this.#reported[slot] = 0
    region.inflight++
    this.inFlight++
    return TAGGED_WR_ID_BASE + seq
  }

  /** Undoes add() for a request the provider refused. */
  remove(wrId: number): void {
    const slot = this.#slotOf(wrId)
    if (slot >= 0) this.#release(slot)
  }

  /** CompletionQueue dispatch: the completion of a tagged request. */
  complete(entry: CompletionEntry): void {
    const slot = this.#slotOf(entry.wrId)
    if (slot < 0) return
    const tag = this.#tags[slot]!
    const verb = TAGGED_VERBS[this.#verbs[slot]!]!
    const reported = this.#reported[slot] === 1
    this.#release(slot)
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

  /**
   * The QP was destroyed: the device is done with every buffer. Each request
   * still in flight is reported with `error`, after the current call returns
   * (a handler never runs inside close()).
   */
  abandonAll(error: RdmaError): void {
    const tags: number[] = []
    for (let slot = 0; slot <= this.#mask; slot++) {
      if (this.#regions[slot] === undefined) continue
      if (this.#reported[slot] === 0) tags.push(this.#tags[slot]!)
      this.#release(slot)
    }
    this.#report(tags, error)
  }

  /**
   * The CQ failed: no completion will come. Each request in flight is
   * reported with `error` now (after the current call returns); its memory
   * stays in use until the QP is closed.
   */
  reportAll(error: RdmaError): void {
    const tags: number[] = []
    for (let slot = 0; slot <= this.#mask; slot++) {
      if (this.#regions[slot] === undefined || this.#reported[slot] === 1) continue
      this.#reported[slot] = 1
      tags.push(this.#tags[slot]!)
    }
    this.#report(tags, error)
  }

  #report(tags: number[], error: RdmaError): void {
    if (tags.length === 0) return
    const handler = this.handler
    queueMicrotask(() => { for (const tag of tags) handler(tag, error) })
  }

  #slotOf(wrId: number): number {
    const seq = wrId - TAGGED_WR_ID_BASE
    const slot = seq & this.#mask
    return this.#seqs[slot] === seq && this.#regions[slot] !== undefined ? slot : -1
  }

  #release(slot: number): void {
    this.#regions[slot]!.released()
    this.#regions[slot] = undefined
    this.#seqs[slot] = -1
    this.inFlight--
    this.owner.finishedTagged()
  }
}

export function handlerBusy(inFlight: number): RdmaError {
  return new RdmaError(`The completion handler cannot change while ${inFlight} tagged requests are in flight`, { code: 'ERR_BUSY' })
}
