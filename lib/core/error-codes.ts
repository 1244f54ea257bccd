// Every code an RdmaError (or a coded TypeError/RangeError) of this library
// can carry. test/unit/16.error-codes.test.ts finds each code literal in
// lib/ and native/ and fails if one is missing here.
import type { wcStatusNames } from './constants.js'

/** Codes of the library's own errors (docs/api.md, "Errors"). */
export const LIBRARY_ERROR_CODES = [
  // arguments
  'ERR_INVALID_ARG_TYPE', 'ERR_INVALID_ARG_VALUE', 'ERR_OUT_OF_RANGE',
  // lifetime and state
  'ERR_CLOSED', 'ERR_BUSY', 'ERR_DETACHED', 'ERR_RESIZABLE', 'ERR_QP_STATE', 'ERR_QP_TYPE', 'ERR_QP_SRQ',
  'ERR_WRONG_PD', 'ERR_WRONG_DEVICE', 'ERR_NO_HANDLER', 'ERR_WINDOW_NOT_BOUND', 'ERR_NO_BYTES',
  // capacity
  'ERR_QUEUE_FULL', 'ERR_CQ_FULL', 'ERR_CQ_TOO_SMALL', 'ERR_MESSAGE_TOO_LARGE', 'ERR_SGE_TOO_LARGE', 'ERR_VIEW_TOO_LARGE',
  'ERR_VIEW_FAILED', 'ERR_MEMLOCK_LIMIT',
  // the addon and the runtime
  'ERR_ADDON_LOAD', 'ERR_NAPI', 'ERR_UV', 'ERR_UNKNOWN',
  // rdma_cm
  'ERR_CM_EVENT', 'ERR_ANSWERED', 'ADDR_ERROR', 'ROUTE_ERROR', 'CONNECT_ERROR',
  // rdma_cm's DEVICE_REMOVAL: the listener or connection on that device was closed
  'ERR_DEVICE_REMOVED',
  // async events that fail a queue pair, a queue or a device
  'QP_FATAL', 'QP_REQ_ERR', 'QP_ACCESS_ERR', 'CQ_ERR', 'DEVICE_FATAL',
  // waits
  'ABORT_ERR',
  // the transfer engine
  'ERR_TRANSFER', 'ERR_BLOCK_RANGE', 'ERR_PEER_GONE', 'ERR_SEGMENT_EXISTS', 'ERR_SEGMENT_UNKNOWN', 'ERR_SEGMENT_WITHDRAWN', 'ERR_TRANSFER_PROTOCOL',
  'ERR_STALLED', 'ERR_CONTROL_SEND', 'ERR_PEER_RESTARTED',
  // grant() or revoke() of a segment every peer shares (registered without options.peers)
  'ERR_SEGMENT_SHARED',
  // the transfer engine's admission (options.admission: a peer without the secret, or not allowed)
  'ERR_PEER_REFUSED',
  // the warning (process.emitWarning) of transport 'auto' running over TCP: not an error, listed as the codes are
  'NODE_IBVERBS_TCP_FALLBACK',
  // the transfer engine's cluster metadata (lib/transfer/metadata/)
  'ERR_PEER_UNKNOWN', 'ERR_STALE_PEER', 'ERR_METADATA', 'ERR_METADATA_UNAVAILABLE', 'ERR_METADATA_RECORD', 'ERR_NAME_TAKEN', 'ERR_PEER_UNREACHABLE',
  // bytes that arrived other than sent (the doctor's loopback check)
  'ERR_DATA_MISMATCH',
  // the lock table
  'ERR_LOCK_FENCED', 'ERR_LOCK_LEASE_EXPIRED', 'ERR_LOCK_LOST', 'ERR_LOCK_TIMEOUT',
] as const

export type LibraryErrorCode = typeof LIBRARY_ERROR_CODES[number]

/** A failed work completion: its status name, e.g. 'REM_ACCESS_ERR'. */
export type CompletionStatusCode = Exclude<typeof wcStatusNames[number], 'SUCCESS'> | `STATUS_${number}`

/** A failed verbs, rdma_cm or system call: the errno name, e.g. 'ENOMEM', 'ETIMEDOUT'. */
export type ErrnoCode = `E${Uppercase<string>}`

/** The `code` of an RdmaError. */
export type RdmaErrorCode = LibraryErrorCode | CompletionStatusCode | ErrnoCode
