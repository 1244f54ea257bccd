// What one queue of a QP holds on its (possibly shared) CQ.
import type { PendingCounter } from './pending.js'
import type { WorkQueueSlots } from './slots.js'

/** The CQ as a ledger sees it. */
export interface LedgerCq {
  addPending(): void
  removePending(): void
  readonly credits: WorkQueueSlots
}

/**
 * What one queue of a QP holds on its (possibly shared) CQ: requests waiting
 * there (they keep it polling) and credits (entries promised to its work
 * requests). Holds the QP only while requests wait (`holder`; collectedQps
 * holds the ledger): whoever awaits a request may hold nothing but its
 * promise, and the request must still settle. A server loop awaiting only
 * `conn.receiveJson()` was collected with its connection, and the peer saw a
 * disconnect. A QP dropped without close() and with nothing in flight is
 * collected and gives these back (see `collectedQps`).
 */
export class QueueLedger implements PendingCounter {
  pendings = 0
  credits = 0
  holder: object | undefined = undefined
  constructor(readonly cq: LedgerCq) {}
  addPending(owner: object): void {
    if (this.pendings++ === 0) this.holder = owner
    this.cq.addPending()
  }
  removePending(): void {
    if (--this.pendings === 0) this.holder = undefined
    this.cq.removePending()
  }
  /** Gives back credits to the CQ. */
  give(credits: number): void {
    this.credits -= credits
    this.cq.credits.release(credits)
  }
  /** The QP was collected with requests in flight: its native QP is destroyed, nothing will complete them. */
  giveAll(): void {
    this.give(this.credits)
    for (; this.pendings > 0; this.pendings--) this.cq.removePending()
    this.holder = undefined
  }
}
