// A QP garbage-collected without close() gives back what it held on its CQs
// and SRQ (close() does it itself and unregisters).
import type { QueueLedger } from '../ops/queue-ledger.js'
import type { CompletionQueue } from './completion-queue.js'
import type { SharedReceiveQueue } from './shared-receive-queue.js'

export interface QpLedger { send: QueueLedger; recv: QueueLedger; recvCq: CompletionQueue; srq: SharedReceiveQueue | undefined; qpn: number }

export const collectedQps = new FinalizationRegistry<QpLedger>(({ send, recv, recvCq, srq, qpn }) => {
  send.giveAll()
  recv.giveAll()
  srq?.detach({ recvCq, qpn })
})
