// The error a failed transfer rejects with: an RdmaError that also says how
// many bytes are known to have landed (confirmed by completions) before it failed.
import type { RdmaErrorCode } from '../core/error-codes.js'
import { RdmaError } from '../core/errors.js'

export class TransferError extends RdmaError {
  /** Bytes confirmed placed (write: in the peer's memory; read: here) before the failure. */
  readonly bytesLanded: number
  /** Bytes the transfer was to move. */
  readonly bytes: number
  /** The peer's id. */
  readonly peer: string

  constructor(message: string, details: { code: RdmaErrorCode; bytesLanded: number; bytes: number; peer: string; status?: string; cause?: unknown }) {
    super(message, { code: details.code, ...(details.status ? { status: details.status } : {}), cause: details.cause })
    this.name = 'TransferError'
    this.bytesLanded = details.bytesLanded
    this.bytes = details.bytes
    this.peer = details.peer
  }
}

/** The code to report for a transfer that failed because of `error`. */
export function codeOf(error: unknown): RdmaErrorCode {
  return typeof (error as { code?: unknown })?.code === 'string' ? (error as { code: RdmaErrorCode }).code : 'ERR_TRANSFER'
}
