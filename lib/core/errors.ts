// One error class for everything RDMA: failed verbs calls (code = errno name,
// errno, syscall) and failed work completions (status name, verb, wr_id, QP).
import { constants } from 'node:os'
import type { ErrnoCode, RdmaErrorCode } from './error-codes.js'

export interface RdmaErrorDetails {
  code: RdmaErrorCode
  errno?: number
  syscall?: string
  status?: string
  verb?: string
  wrId?: number
  qpn?: number
  vendorError?: number
  posted?: number
  cause?: unknown
}

export class RdmaError extends Error {
  /** What went wrong, as a code to switch on (the union lists them all; docs/api.md, "Errors"). */
  readonly code: RdmaErrorCode
  declare readonly errno?: number
  declare readonly syscall?: string
  /** Work completion status name, e.g. 'REM_ACCESS_ERR'. */
  declare readonly status?: string
  /** The operation that failed, e.g. 'write'. */
  declare readonly verb?: string
  declare readonly wrId?: number
  declare readonly qpn?: number
  declare readonly vendorError?: number
  /** For a failed batch post: how many work requests reached the queue. */
  declare readonly posted?: number
  /** openDevice() with code 'ENODEV': the names of the devices that exist. */
  declare readonly devices?: string[]
  /** A failed rdma_cm step (e.g. a rejected connect): the private data the peer sent, if any. */
  declare readonly privateData?: Buffer
  /** A failed rdma_cm step: the event's status (for REJECTED, the reject reason). */
  declare readonly cmStatus?: number

  constructor(message: string, details: RdmaErrorDetails) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause })
    this.name = 'RdmaError'
    this.code = details.code
    if (details.errno !== undefined) this.errno = details.errno
    if (details.syscall !== undefined) this.syscall = details.syscall
    if (details.status !== undefined) this.status = details.status
    if (details.verb !== undefined) this.verb = details.verb
    if (details.wrId !== undefined) this.wrId = details.wrId
    if (details.qpn !== undefined) this.qpn = details.qpn
    if (details.vendorError !== undefined) this.vendorError = details.vendorError
    if (details.posted !== undefined) this.posted = details.posted
  }
}

/** Converts an error thrown by the addon into an RdmaError (or a Node-style TypeError/RangeError). */
export function fromNative(error: unknown): Error {
  if (error instanceof RdmaError) return error // already ours (e.g. the remembered ERR_ADDON_LOAD)
  if (!(error instanceof Error)) return new RdmaError(String(error), { code: 'ERR_UNKNOWN' })
  const e = error as Error & { code?: string; errno?: number; syscall?: string; posted?: number }
  if (e.code === 'ERR_INVALID_ARG_TYPE' || e.code === 'ERR_INVALID_ARG_VALUE') {
    return Object.assign(new TypeError(e.message), { code: e.code })
  }
  if (e.code === 'ERR_OUT_OF_RANGE') return Object.assign(new RangeError(e.message), { code: e.code })
  // The addon's codes are errno names and the ERR_ codes of error-codes.ts (unit/16 checks its sources).
  const details: RdmaErrorDetails = { code: (e.code ?? 'ERR_UNKNOWN') as RdmaErrorCode }
  if (e.errno !== undefined) details.errno = e.errno
  if (e.syscall !== undefined) details.syscall = e.syscall
  if (e.posted !== undefined) details.posted = e.posted
  return new RdmaError(e.message, details)
}

/** Runs a native call and rethrows its error as an RdmaError. */
export function call<T>(fn: () => T): T {
  try {
    return fn()
  } catch (error) {
    throw fromNative(error)
  }
}

export function closedError(what: string): RdmaError {
  return new RdmaError(`${what} is closed`, { code: 'ERR_CLOSED' })
}

let errnoNames: Map<number, string> | undefined

/** The name of an errno value ('EIO'), as failed calls carry it in `code`. */
export function errnoName(errno: number): ErrnoCode {
  errnoNames ??= new Map(Object.entries(constants.errno).map(([name, value]) => [value, name]))
  return (errnoNames.get(errno) ?? `E${errno}`) as ErrnoCode
}
