// Encodes work requests into a reusable Uint32Array that the addon posts with
// one ibv_post_send/ibv_post_recv call. Layout mirrors native/hot/work_request.h.
import { markAsUntransferable } from 'node:worker_threads'
import { RECV_HEADER_WORDS, SEND_HEADER_WORDS } from '../native/addon.js'
import { RdmaError } from '../core/errors.js'
import { writeOperand, writeU64 } from '../core/u64.js'
import { SendFlags, WrOpcode } from '../core/constants.js'

/** What the encoder reads of a local slice (verbs' LocalSlice, bounds-checked when made). */
export interface LocalBytes { readonly region: { readonly address: number; readonly lkey: number }; readonly offset: number; readonly length: number }
/** What the encoder reads of a remote slice (verbs' RemoteSlice). */
export interface RemoteBytes { readonly addrLo: number; readonly addrHi: number; readonly rkey: number; readonly region: { readonly rkey: number } }

const SEND_HEADER = SEND_HEADER_WORDS // 16
const RECV_HEADER = RECV_HEADER_WORDS // 4
const SGE_WORDS = 4
const TWO_32 = 4294967296
const INLINE = 8 // IBV_SEND_INLINE

/** A local scatter/gather element: address, length, lkey. */
export interface Sge { address: number; length: number; lkey: number }

export interface SendWr {
  wrId: number
  opcode: number
  flags: number
  sges: readonly Sge[]
  /** Immediate data, or the rkey to invalidate for LOCAL_INV / SEND_WITH_INV. */
  immOrRkey?: number
  remoteHi?: number
  remoteLo?: number
  rkey?: number
  compareAdd?: bigint
  swap?: bigint
  ahId?: number
  remoteQpn?: number
  remoteQkey?: number
}

/**
 * The addon keeps pointers into an encoder's buffer (the post functions bound
 * to it): a transfer (postMessage, structuredClone) must never detach it.
 */
function untransferable(words: Uint32Array): Uint32Array {
  markAsUntransferable(words.buffer)
  return words
}

export class WorkRequestEncoder {
  private words = untransferable(new Uint32Array(1024))
  private size = 0
  count = 0

  /** Whether a request with inline data was added since the last reset. */
  hasInline = false

  reset(): void {
    this.hasInline = false
    this.size = 0
    this.count = 0
  }

  get buffer(): Uint32Array { return this.words }

  /** Drops what was written after `words` (a request that failed while being encoded). */
  truncate(words: number, count: number): void {
    this.size = words
    this.count = count
  }

  /** Words written so far (where the next work request starts). */
  get used(): number { return this.size }

  private reserve(n: number): number {
    const at = this.size
    if (at + n > this.words.length) {
      const bigger = untransferable(new Uint32Array(Math.max(this.words.length * 2, at + n)))
      bigger.set(this.words.subarray(0, at))
      this.words = bigger
    }
    this.size = at + n
    return at
  }

  addSend(wr: SendWr): void {
    const n = wr.sges.length
    const at = this.reserve(SEND_HEADER + n * SGE_WORDS)
    const w = this.words
    w[at] = wr.wrId >>> 0
    w[at + 1] = Math.floor(wr.wrId / TWO_32)
    w[at + 2] = wr.opcode
    w[at + 3] = wr.flags
    if (wr.flags & INLINE) this.hasInline = true
    w[at + 4] = n
    w[at + 5] = wr.immOrRkey ?? 0
    w[at + 6] = wr.remoteLo ?? 0
    w[at + 7] = wr.remoteHi ?? 0
    w[at + 8] = wr.rkey ?? 0
    if (wr.compareAdd === undefined) { // BigInt work only for atomics
      w[at + 9] = 0
      w[at + 10] = 0
    } else {
      writeU64(w, at + 9, wr.compareAdd)
    }
    if (wr.swap === undefined) {
      w[at + 11] = 0
      w[at + 12] = 0
    } else {
      writeU64(w, at + 11, wr.swap)
    }
    w[at + 13] = wr.ahId ?? 0
    w[at + 14] = wr.remoteQpn ?? 0
    w[at + 15] = wr.remoteQkey ?? 0
    writeSges(w, at + SEND_HEADER, wr.sges)
    this.count++
  }

  /**
   * A send work request with at most one SGE (`length` 0: none), written
   * straight into the words: the hot path builds no wr or sge objects.
   * `compareAdd` and `swap` are the atomics' operands (as 64-bit words).
   */
  addOne(wrId: number, opcode: number, flags: number, address: number, length: number, lkey: number,
    remoteLo: number, remoteHi: number, rkey: number, immOrRkey: number): number {
    const n = length > 0 ? 1 : 0
    const at = this.reserve(SEND_HEADER + n * SGE_WORDS)
    const w = this.words
    w[at] = wrId >>> 0
    w[at + 1] = Math.floor(wrId / TWO_32)
    w[at + 2] = opcode
    w[at + 3] = flags
    if (flags & INLINE) this.hasInline = true
    w[at + 4] = n
    w[at + 5] = immOrRkey
    w[at + 6] = remoteLo
    w[at + 7] = remoteHi
    w[at + 8] = rkey
    w[at + 9] = 0
    w[at + 10] = 0
    w[at + 11] = 0
    w[at + 12] = 0
    w[at + 13] = 0
    w[at + 14] = 0
    w[at + 15] = 0
    if (n !== 0) {
      if (length > 0xffffffff) throw sgeTooLarge(length)
      w[at + 16] = address >>> 0
      w[at + 17] = Math.floor(address / TWO_32)
      w[at + 18] = length
      w[at + 19] = lkey
    }
    this.count++
    return at
  }

  /**
   * `n` requests of one SGE each: `opcodes[i]` (a WRITE or READ of
   * `remotes[i]`, or a SEND with no remote), immediate data `imms[i]` where
   * the opcode carries it, with wr_ids `first` .. `first + n - 1`, only the
   * last signaled unless `signalEach`: postBatch()'s hot path, one call per
   * batch (a call per request passes its 64-bit address as a heap number).
   * The caller checked every slice: a length of 1 .. the max message size,
   * within its region.
   */
  addSliceColumns(first: number, n: number, locals: readonly LocalBytes[], remotes: ReadonlyArray<RemoteBytes | undefined>, opcodes: readonly number[],
    imms: readonly number[], baseFlags: number, signalEach: boolean): void {
    const stride = SEND_HEADER + SGE_WORDS
    let at = this.reserve(n * stride)
    const w = this.words
    const last = n - 1
    for (let i = 0; i < n; i++, at += stride) {
      const local = locals[i]!
      const remote = remotes[i]
      const region = local.region
      const wrId = first + i
      const address = region.address + local.offset
      w[at] = wrId >>> 0
      w[at + 1] = Math.floor(wrId / TWO_32)
      w[at + 2] = opcodes[i]!
      w[at + 3] = signalEach || i === last ? baseFlags | SendFlags.Signaled : baseFlags
      w[at + 4] = 1
      // Word 5 (immediate data) is read only for the opcodes that carry it, 9-12 (atomic operands) only
      // for atomics, 6-8 only for RDMA opcodes, 14-15 (UD destination) only when word 13 names an address handle.
      w[at + 5] = imms[i]!
      if (remote !== undefined) {
        w[at + 6] = remote.addrLo
        w[at + 7] = remote.addrHi
        w[at + 8] = remote.region.rkey
      }
      w[at + 13] = 0
      w[at + 16] = address >>> 0
      w[at + 17] = Math.floor(address / TWO_32)
      w[at + 18] = local.length
      w[at + 19] = region.lkey
    }
    this.count += n
  }

  /**
   * Encodes one signaled READ, WRITE or atomic of `local` (1 byte or more)
   * as the only request, at word 0 (an atomic's operands: then
   * setAtomicOperands(0, ...)): the tagged path's encoder. Like
   * addSliceColumns(), it writes only the words the decoder reads for these
   * opcodes, and takes the slices, so the 64-bit address is made here.
   * (Counted: ~250 instructions fewer per tagged post than reset() + addOne(),
   * and than the same writes at an offset after reserve().)
   */
  setOnly(wrId: number, opcode: number, local: LocalBytes, remote: RemoteBytes): void {
    const w = this.words // never shorter than one request with one SGE
    const region = local.region
    const address = region.address + local.offset
    this.size = SEND_HEADER + SGE_WORDS
    this.count = 1
    this.hasInline = false
    w[0] = wrId >>> 0
    w[1] = Math.floor(wrId / TWO_32)
    w[2] = opcode
    w[3] = SendFlags.Signaled
    w[4] = 1
    w[6] = remote.addrLo
    w[7] = remote.addrHi
    w[8] = remote.rkey
    w[13] = 0
    w[16] = address >>> 0
    w[17] = Math.floor(address / TWO_32)
    w[18] = local.length
    w[19] = region.lkey
  }

  /**
   * Sets the 64-bit operands of the atomic written at `at`, each with what
   * smallU64() returned for it (the operand as a number below 2^32, else -1).
   */
  setAtomicOperands(at: number, compareAdd: bigint, compareAddSmall: number, swap: bigint, swapSmall: number): void {
    writeOperand(this.words, at + 9, compareAdd, compareAddSmall)
    writeOperand(this.words, at + 11, swap, swapSmall)
  }

  addRecv(wrId: number, sges: readonly Sge[]): void {
    const n = sges.length
    const at = this.reserve(RECV_HEADER + n * SGE_WORDS)
    const w = this.words
    w[at] = wrId >>> 0
    w[at + 1] = Math.floor(wrId / TWO_32)
    w[at + 2] = n
    w[at + 3] = 0
    writeSges(w, at + RECV_HEADER, sges)
    this.count++
  }
}

function writeSges(w: Uint32Array, at: number, sges: readonly Sge[]): void {
  for (const sge of sges) {
    // The last line of defence: operations are split before they get here.
    if (sge.length > 0xffffffff) throw sgeTooLarge(sge.length)
    w[at] = sge.address >>> 0
    w[at + 1] = Math.floor(sge.address / TWO_32)
    w[at + 2] = sge.length
    w[at + 3] = sge.lkey
    at += SGE_WORDS
  }
}

function sgeTooLarge(length: number): RdmaError {
  return new RdmaError(`An SGE names at most 4294967295 bytes (its length field has 32 bits), not ${length}`, { code: 'ERR_SGE_TOO_LARGE' })
}
