// The error a failed transfer rejects with: an RdmaError that also says which
// of the caller's blocks are known to have landed (confirmed by completions,
// those delivered when the link closed included) before it failed.
import type { RdmaErrorCode } from '../core/error-codes.js'
import { RdmaError } from '../core/errors.js'

/** What a failed transfer knows landed. */
export interface LandedReport {
  /** Bytes of the blocks that landed whole (the sum of their lengths). */
  bytesLanded: number
  /** Blocks that landed whole. */
  blocksLanded: number
  /** Bit i (byte i >> 3, bit i & 7, least significant first) set: the caller's block i landed whole. */
  landedBlocks: Uint8Array
}

export class TransferError extends RdmaError implements LandedReport {
  /** Bytes of the blocks confirmed placed whole (write: in the peer's memory; read: here) before the failure. */
  readonly bytesLanded: number
  readonly blocksLanded: number
  /** A bitmap over the caller's block indexes (see blockLanded()); blocks not set may or may not have landed. */
  readonly landedBlocks: Uint8Array
  /** Bytes the transfer was to move. */
  readonly bytes: number
  /** The peer's id. */
  readonly peer: string

  constructor(message: string, details: LandedReport & { code: RdmaErrorCode; bytes: number; peer: string; status?: string; cause?: unknown }) {
    super(message, { code: details.code, ...(details.status ? { status: details.status } : {}), cause: details.cause })
    this.name = 'TransferError'
    this.bytesLanded = details.bytesLanded
    this.blocksLanded = details.blocksLanded
    this.landedBlocks = details.landedBlocks
    this.bytes = details.bytes
    this.peer = details.peer
  }

  /** Whether the caller's block `index` landed whole. */
  blockLanded(index: number): boolean {
    return ((this.landedBlocks[index >> 3] ?? 0) >> (index & 7) & 1) === 1
  }
}

/** The code to report for a transfer that failed because of `error`. */
export function codeOf(error: unknown): RdmaErrorCode {
  return typeof (error as { code?: unknown })?.code === 'string' ? (error as { code: RdmaErrorCode }).code : 'ERR_TRANSFER'
}
