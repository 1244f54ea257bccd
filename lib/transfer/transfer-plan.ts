// A transfer checked once by TransferAgent.prepare(), run as often as needed.
import type { TransferOptions } from './agent-options.js'
import type { Peer } from './peer.js'
import type { Blocks, TransferOp } from './plan.js'
import type { TransferResult } from './run.js'

export class TransferPlan {
  /** @internal */
  constructor(readonly peer: Peer, readonly op: TransferOp, readonly blocks: Blocks, readonly bytes: number, private readonly runner: (options: TransferOptions) => Promise<TransferResult>) {}

  /** Runs the plan (rechecked only when the peer's segments changed). */
  run(options: TransferOptions = {}): Promise<TransferResult> { return this.runner(options) }
}
