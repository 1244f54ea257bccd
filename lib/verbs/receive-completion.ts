// A receive's completion as users see it.
import { WcFlags, wcOpcodeNames } from '../core/constants.js'
import type { CompletionEntry } from '../ops/pending.js'

/** A completed receive. */
export interface ReceiveCompletion {
  byteLength: number
  opcode: string
  immediate?: number
  invalidatedRkey?: number
  /** UD: the sender's QP number; the first 40 bytes of the buffer hold the GRH when `grh` is true. */
  srcQp: number
  slid: number
  sl: number
  grh: boolean
  qpn: number
  wrId: number
}

/** A receive completion as users see it; for a SEND_WITH_INV, `invalidated(rkey)` is told the rkey the sender revoked here. */
export function receiveCompletion(entry: CompletionEntry, invalidated: (rkey: number) => void): ReceiveCompletion {
  const result: ReceiveCompletion = {
    byteLength: entry.byteLength,
    opcode: wcOpcodeNames[entry.opcode] ?? String(entry.opcode),
    srcQp: entry.srcQp,
    slid: entry.slid,
    sl: entry.sl,
    grh: (entry.wcFlags & WcFlags.Grh) !== 0,
    qpn: entry.qpn,
    wrId: entry.wrId,
  }
  if (entry.wcFlags & WcFlags.WithImm) result.immediate = entry.immOrRkey
  if (entry.wcFlags & WcFlags.WithInv) {
    result.invalidatedRkey = entry.immOrRkey
    invalidated(entry.immOrRkey)
  }
  return result
}
