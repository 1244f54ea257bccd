// Why a QP's work queue cannot take a request now, as the coded error the
// caller gets (cold paths, kept out of the queues' bookkeeping).
import { closedError, RdmaError } from '../core/errors.js'
import type { QpStateName } from '../core/constants.js'
import type { WorkQueueSlots } from './slots.js'

/** ERR_QP_STATE: the QP's state does not allow posting to `queue`. */
export function wrongState(verb: string, qpn: number, state: QpStateName, queue: 'send' | 'recv'): RdmaError {
  const needs = queue === 'send' ? 'needs RTS: connect() first' : 'needs INIT or later'
  return new RdmaError(`Cannot ${verb}: QP ${qpn} is in state ${state} (${needs})`, { code: 'ERR_QP_STATE', verb, qpn })
}

/** ERR_QP_STATE: the QP failed (its cause attached). */
export function stateError(verb: string, qpn: number, cause: RdmaError): RdmaError {
  return new RdmaError(`Cannot ${verb}: QP ${qpn} is in the error state (${cause.status ?? cause.code})`, {
    code: 'ERR_QP_STATE', status: cause.status, verb, qpn, cause,
  } as never)
}

/** Why a send slot and CQ credit could not be taken now, as the error a tagged post throws. */
export function cannotPostNow(verb: string, qpn: number, queue: { open: boolean; failure: RdmaError | undefined; state: QpStateName; slots: WorkQueueSlots; credits: WorkQueueSlots }): RdmaError {
  if (!queue.open) return closedError('QueuePair')
  if (queue.failure) return stateError(verb, qpn, queue.failure)
  if (queue.state !== 'RTS') return wrongState(verb, qpn, queue.state, 'send')
  const { slots, credits } = queue
  if (slots.used < slots.capacity && credits.used < credits.capacity) {
    return new RdmaError(`Cannot ${verb}: promise requests wait for the send queue before this one`, { code: 'ERR_QUEUE_FULL', verb, qpn })
  }
  if (slots.used >= slots.capacity) {
    return new RdmaError(`Cannot ${verb}: the send queue is full (${slots.capacity} requests in flight); post again after a completion`, { code: 'ERR_QUEUE_FULL', verb, qpn })
  }
  return new RdmaError(`Cannot ${verb}: the completion queue is full (${credits.capacity} completions promised); post again after a completion`, { code: 'ERR_CQ_FULL', verb, qpn })
}
