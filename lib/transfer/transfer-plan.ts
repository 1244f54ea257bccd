// A transfer checked once by TransferAgent.prepare(), run as often as needed.
import type { TransferOptions } from './agent-options.js'
import type { Peer } from './peer.js'
import type { Blocks, TransferOp } from './plan.js'
import type { TransferResult } from './run.js'

export class TransferPlan {
  /** @internal */
  constructor(readonly peer: Peer, readonly op: TransferOp, readonly blocks: Blocks, readonly bytes: number, private readonly runner: (options: TransferOptions) => Promise<TransferResult>) {}

  /**
   * Runs the plan. It was checked by prepare(); it is checked again (as a
   * fresh write()/read() would be) only when the link to the peer is new or
   * a segment it names was withdrawn since: then a segment registered again
   * under the same name is used, one that is gone fails with
   * ERR_SEGMENT_WITHDRAWN (ERR_SEGMENT_UNKNOWN on a new link), one too short
   * with ERR_BLOCK_RANGE, before anything is posted.
   */
  run(options: TransferOptions = {}): Promise<TransferResult> { return this.runner(options) }
}
