// Splits a write or read that is longer than the device's max message size
// into several work requests that together move the same bytes, in order.
import { SendFlags, WrOpcode } from '../core/constants.js'
import { rangeError } from '../core/validate.js'
import type { SendWr, Sge } from './encoder.js'

const TWO_32 = 4294967296
/** The most bytes one SGE (and so one work request, here) can name: its length field has 32 bits. */
export const MAX_SGE_BYTES = TWO_32 - 1

/**
 * The work requests for `wr` (a write or read of `length` bytes) with at
 * most `maxBytes` each. Every piece keeps the rkey and continues the remote
 * address where the previous one ended; the local SGE list is cut at the same
 * byte offsets, so no piece has more SGEs than `wr`. FENCE stays on the first
 * piece; SOLICITED, SIGNALED and the immediate (WRITE_WITH_IMM) stay on the
 * last, so the peer sees the immediate only once all the data has landed.
 */
export function splitWr(wr: SendWr, length: number, maxBytes: number): SendWr[] {
  const max = Math.min(maxBytes, MAX_SGE_BYTES)
  if (!(max >= 1)) throw rangeError('a max message size of at least 1 byte', 'maxBytes', maxBytes)
  const pieces: SendWr[] = []
  let remoteHi = wr.remoteHi ?? 0
  let remoteLo = wr.remoteLo ?? 0
  let sgeIndex = 0
  let sgeOffset = 0 // bytes of wr.sges[sgeIndex] already taken
  for (let done = 0; done < length;) {
    const pieceLength = Math.min(max, length - done)
    const sges: Sge[] = []
    for (let left = pieceLength; left > 0;) {
      const sge = wr.sges[sgeIndex]!
      const take = Math.min(left, sge.length - sgeOffset)
      sges.push({ address: sge.address + sgeOffset, length: take, lkey: sge.lkey })
      left -= take
      sgeOffset += take
      if (sgeOffset === sge.length) { sgeIndex++; sgeOffset = 0 }
    }
    const last = done + pieceLength === length
    let flags = wr.flags
    if (done > 0) flags &= ~SendFlags.Fence
    if (!last) flags &= ~(SendFlags.Signaled | SendFlags.Solicited)
    const piece: SendWr = { wrId: 0, opcode: wr.opcode, flags, sges, remoteHi, remoteLo, rkey: wr.rkey }
    if (wr.opcode === WrOpcode.RdmaWriteWithImm) {
      if (last) piece.immOrRkey = wr.immOrRkey
      else piece.opcode = WrOpcode.RdmaWrite
    }
    pieces.push(piece)
    done += pieceLength
    remoteLo += pieceLength
    remoteHi = (remoteHi + Math.floor(remoteLo / TWO_32)) >>> 0
    remoteLo %= TWO_32
  }
  return pieces
}
