// Receives posted to a QP's own receive queue: one buffer (recv()) or several
// with one native call (recvMany()).
import { RdmaError } from '../core/errors.js'
import { typeError, waitOptions, type WaitOptions } from '../core/validate.js'
import type { CompletionEntry } from '../ops/pending.js'
import type { QpQueues } from '../ops/qp-queues.js'
import { ReceiveBatch } from '../ops/receive-batch.js'
import type { LocalSlice } from './memory.js'
import { localSges } from './local-sges.js'
import type { ProtectionDomain } from './protection-domain.js'
import type { ReceiveCompletion } from './receive-completion.js'
import type { SharedReceiveQueue } from './shared-receive-queue.js'

/** What posting receives needs of the QP. */
export interface ReceiveContext {
  readonly pd: ProtectionDomain
  readonly srq: SharedReceiveQueue | undefined
  readonly maxRecvSge: number
  /** @internal (its type names regions' module-private members) */
  readonly queues: QpQueues<LocalSlice>
  toCompletion(entry: CompletionEntry): ReceiveCompletion
  postRecv(words: Uint32Array, count: number): void
}

/** Posts a receive buffer; resolves when a message lands in it. */
export function receive(qp: ReceiveContext, local: LocalSlice | readonly LocalSlice[], options: WaitOptions): Promise<ReceiveCompletion> {
  return new Promise((resolve, reject) => {
    try {
      const wait = waitOptions(options)
      if (qp.srq) throw new RdmaError('This QP receives through its SRQ: use srq.recv()', { code: 'ERR_QP_SRQ' })
      const { sges, regions } = localSges(local, 'local', qp.maxRecvSge, qp.pd)
      qp.queues.submit('recv', 'recv', 1, regions, wait, resolve, reject, qp.toCompletion, (first, enc) => enc.addRecv(first, sges))
    } catch (error) {
      reject(error)
    }
  })
}

/**
 * Posts several receive buffers with one native call (one doorbell), in
 * order: one promise per buffer. What receive() would reject with before
 * posting is thrown here, and nothing is posted.
 */
export function receiveMany(qp: ReceiveContext, locals: ReadonlyArray<LocalSlice | readonly LocalSlice[]>, options: WaitOptions): Array<Promise<ReceiveCompletion>> {
  if (!Array.isArray(locals)) throw typeError('an array of receive buffers (each a LocalSlice or an array of them)', 'locals', locals)
  const wait = waitOptions(options)
  if (qp.srq) throw new RdmaError('This QP receives through its SRQ: use srq.recvMany()', { code: 'ERR_QP_SRQ' })
  const buffers = locals.map((local, i) => localSges(local, `locals[${i}]`, qp.maxRecvSge, qp.pd))
  if (buffers.length === 0) return []
  const receives = new ReceiveBatch<ReceiveCompletion>(buffers)
  const queues = qp.queues
  queues.reserve('recv', 'recv', buffers.length, wait, receives.rejectAll,
    (left) => receives.post(queues, queues.recv, queues.wrIds, queues.encoder, left, qp.toCompletion, qp.postRecv), 'locals.length')
  return receives.promises
}
