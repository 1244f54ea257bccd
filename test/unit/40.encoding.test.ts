// Layer 4: the word layout of encoded work requests. It must match
// native/hot/work_request.{h,cc}: send header 16 words, recv header 4 words, SGE
// 4 words (addr lo, addr hi, length, lkey); 64-bit values as lo, hi.
import { describe, expect, it } from 'vitest'
import { WorkRequestEncoder } from '../../lib/ops/encoder.js'
import { SendFlags, WrOpcode } from '../../lib/core/constants.js'
import { native } from '../../lib/native/addon.js'
import { thrown } from './thrown.js'

const TWO_32 = 2 ** 32

describe('WorkRequestEncoder', () => {
  it('encodes an RDMA write with two SGEs', () => {
    const e = new WorkRequestEncoder()
    const wrId = 5 * TWO_32 + 7 // above 2^32
    e.addSend({
      wrId, opcode: WrOpcode.RdmaWriteWithImm, flags: SendFlags.Signaled | SendFlags.Fence,
      sges: [
        { address: 0x7f0012345000, length: 4096, lkey: 0x1111 },
        { address: 0x1000, length: 8, lkey: 0x2222 },
      ],
      immOrRkey: 0xcafebabe, remoteHi: 0x7f01, remoteLo: 0xfffff000, rkey: 0xabcdef01,
    })
    expect(e.count).toBe(1)
    expect(Array.from(e.buffer.subarray(0, 16 + 8))).toEqual([
      7, 5, // wr_id lo, hi
      WrOpcode.RdmaWriteWithImm,
      SendFlags.Signaled | SendFlags.Fence,
      2, // num_sge
      0xcafebabe, // imm
      0xfffff000, 0x7f01, // remote addr lo, hi
      0xabcdef01, // rkey
      0, 0, 0, 0, // compare/add, swap
      0, 0, 0, // ah id, remote qpn, qkey
      0x12345000, 0x7f00, 4096, 0x1111, // SGE 0
      0x1000, 0, 8, 0x2222, // SGE 1
    ])
  })

  it('splits compare and swap bigints into lo/hi words', () => {
    const e = new WorkRequestEncoder()
    e.addSend({
      wrId: 1, opcode: WrOpcode.AtomicCmpAndSwp, flags: SendFlags.Signaled,
      sges: [{ address: 0x2000, length: 8, lkey: 3 }],
      remoteHi: 1, remoteLo: 2, rkey: 4,
      compareAdd: 0x0123456789abcdefn, swap: 0xfedcba9876543210n,
    })
    const w = e.buffer
    expect(w[9]).toBe(0x89abcdef)
    expect(w[10]).toBe(0x01234567)
    expect(w[11]).toBe(0x76543210)
    expect(w[12]).toBe(0xfedcba98)
    expect(w[4]).toBe(1)
    expect(Array.from(w.subarray(16, 20))).toEqual([0x2000, 0, 8, 3])
  })

  it('encodes the maximum 64-bit compare value', () => {
    const e = new WorkRequestEncoder()
    e.addSend({ wrId: 1, opcode: WrOpcode.AtomicFetchAndAdd, flags: 0, sges: [], compareAdd: 2n ** 64n - 1n })
    expect(e.buffer[9]).toBe(0xffffffff)
    expect(e.buffer[10]).toBe(0xffffffff)
    expect(e.buffer[11]).toBe(0)
    expect(e.buffer[12]).toBe(0)
  })

  it('encodes a UD send destination and a wr_id near 2^53', () => {
    const e = new WorkRequestEncoder()
    const wrId = Number.MAX_SAFE_INTEGER // 2^53 - 1
    e.addSend({ wrId, opcode: WrOpcode.Send, flags: SendFlags.Signaled | SendFlags.Inline, sges: [], ahId: 9, remoteQpn: 0xabcdef, remoteQkey: 0x11111111 })
    const w = e.buffer
    expect(w[0]).toBe(0xffffffff)
    expect(w[1]).toBe(0x1fffff)
    expect(w[0]! + w[1]! * TWO_32).toBe(wrId) // what completion-queue.ts reassembles
    expect(w[4]).toBe(0)
    expect(Array.from(w.subarray(13, 16))).toEqual([9, 0xabcdef, 0x11111111])
  })

  it('encodes LOCAL_INV with the rkey in the imm/invalidate word', () => {
    const e = new WorkRequestEncoder()
    e.addSend({ wrId: 2, opcode: WrOpcode.LocalInv, flags: SendFlags.Signaled, sges: [], immOrRkey: 0x8000_0001 })
    expect(e.buffer[2]).toBe(7)
    expect(e.buffer[5]).toBe(0x80000001)
  })

  it('encodes a receive', () => {
    const e = new WorkRequestEncoder()
    e.addRecv(3 * TWO_32 + 1, [{ address: 2 ** 40 + 0x10, length: 512, lkey: 0x77 }])
    expect(e.count).toBe(1)
    expect(Array.from(e.buffer.subarray(0, 8))).toEqual([1, 3, 1, 0, 0x10, 0x100, 512, 0x77])
  })

  it('packs several requests back to back and reset() starts over', () => {
    const e = new WorkRequestEncoder()
    e.addRecv(1, [{ address: 0x100, length: 1, lkey: 1 }])
    e.addRecv(2, [])
    e.addRecv(3, [{ address: 0x300, length: 3, lkey: 3 }, { address: 0x400, length: 4, lkey: 4 }])
    expect(e.count).toBe(3)
    expect(Array.from(e.buffer.subarray(0, 8 + 4 + 12))).toEqual([
      1, 0, 1, 0, 0x100, 0, 1, 1,
      2, 0, 0, 0,
      3, 0, 2, 0, 0x300, 0, 3, 3, 0x400, 0, 4, 4,
    ])
    e.reset()
    expect(e.count).toBe(0)
    e.addRecv(99, [])
    expect(e.buffer[0]).toBe(99)
  })

  it('mixes send and receive layouts consistently (offsets advance by header + SGEs)', () => {
    const e = new WorkRequestEncoder()
    e.addSend({ wrId: 10, opcode: WrOpcode.Send, flags: 0, sges: [{ address: 1, length: 2, lkey: 3 }] })
    e.addSend({ wrId: 11, opcode: WrOpcode.RdmaRead, flags: 0, sges: [] })
    expect(e.buffer[0]).toBe(10)
    expect(e.buffer[16 + 4]).toBe(11)
    expect(e.buffer[16 + 4 + 2]).toBe(WrOpcode.RdmaRead)
  })

  it('grows beyond the initial 1024 words and keeps what was written', () => {
    const e = new WorkRequestEncoder()
    expect(e.buffer.length).toBe(1024)
    const perWr = 16 + 4 // one SGE each
    const count = 200 // 4000 words: two doublings
    for (let i = 0; i < count; i++) {
      e.addSend({ wrId: i + 1, opcode: WrOpcode.RdmaWrite, flags: 0, sges: [{ address: 0x1000 * (i + 1), length: i, lkey: i }], rkey: i })
    }
    expect(e.count).toBe(count)
    expect(e.buffer.length).toBeGreaterThanOrEqual(count * perWr)
    expect(e.buffer.length).toBe(4096)
    for (const i of [0, 50, 51, 52, 199]) { // 51 * 20 = 1020: WR 51 straddles the first boundary
      const at = i * perWr
      expect(e.buffer[at], `wrId of WR ${i}`).toBe(i + 1)
      expect(e.buffer[at + 8], `rkey of WR ${i}`).toBe(i)
      expect(e.buffer[at + 16], `SGE addr of WR ${i}`).toBe(0x1000 * (i + 1))
      expect(e.buffer[at + 18], `SGE len of WR ${i}`).toBe(i)
    }
  })

  it('grows at once for a single request larger than twice the buffer', () => {
    const e = new WorkRequestEncoder()
    const sges = Array.from({ length: 600 }, (_, i) => ({ address: i, length: 1, lkey: 2 })) // 2400 words
    e.addRecv(1, sges)
    expect(e.buffer.length).toBe(4 + 600 * 4)
    expect(e.buffer[4 + 599 * 4]).toBe(599)
  })
})

// The native side of the same layout: native/hot/work_request.cc's DecodeSendBatch
// and DecodeRecvBatch, reached through a test-only export (no device needed),
// decode what the encoder wrote into ibv_send_wr / ibv_recv_wr lists.
interface DecodedSge { addr: bigint; length: number; lkey: number }
interface DecodedWr {
  wrId: bigint; opcode?: number; sendFlags?: number; sges: DecodedSge[]; immData?: number; invalidateRkey?: number
  remoteAddr?: bigint; rkey?: number; compareAdd?: bigint; swap?: bigint; hasAh?: boolean; remoteQpn?: number; remoteQkey?: number
}
const decode = (native as unknown as {
  __testOnlyDecodeWorkRequests(kind: 'send' | 'recv' | 'one', words: Uint32Array, count: number): DecodedWr[]
}).__testOnlyDecodeWorkRequests

const words = (e: WorkRequestEncoder) => e.buffer.slice(0, e.used) // exactly what was written, no spare zeros
const sge = (address: number, length: number, lkey: number) => ({ address, length, lkey })
const decodedSge = (s: { address: number; length: number; lkey: number }) => ({ addr: BigInt(s.address), length: s.length, lkey: s.lkey })

describe('the native decoder reads what the encoder wrote', () => {
  it('round-trips a batch of every send opcode, linked in order', () => {
    const e = new WorkRequestEncoder()
    const write = [sge(0x7f0012345000, 4096, 0x1111), sge(2 ** 40 + 0x10, 8, 0x2222)]
    e.addSend({ wrId: 5 * TWO_32 + 7, opcode: WrOpcode.RdmaWriteWithImm, flags: SendFlags.Signaled | SendFlags.Fence, sges: write,
      immOrRkey: 0xcafebabe, remoteHi: 0x7f01, remoteLo: 0xfffff000, rkey: 0xabcdef01 })
    e.addSend({ wrId: 2, opcode: WrOpcode.RdmaRead, flags: SendFlags.Signaled, sges: [sge(0x3000, 64, 9)], remoteHi: 0, remoteLo: 0x4000, rkey: 5 })
    e.addSend({ wrId: 3, opcode: WrOpcode.AtomicCmpAndSwp, flags: SendFlags.Signaled, sges: [sge(0x2000, 8, 3)],
      remoteHi: 1, remoteLo: 2, rkey: 4, compareAdd: 0x0123456789abcdefn, swap: 0xfedcba9876543210n })
    e.addSend({ wrId: 4, opcode: WrOpcode.AtomicFetchAndAdd, flags: 0, sges: [sge(0x2008, 8, 3)], remoteLo: 0x10, rkey: 6, compareAdd: 2n ** 64n - 1n })
    e.addSend({ wrId: Number.MAX_SAFE_INTEGER, opcode: WrOpcode.SendWithImm, flags: SendFlags.Inline, sges: [], immOrRkey: 0x01020304 })
    e.addSend({ wrId: 6, opcode: WrOpcode.LocalInv, flags: SendFlags.Signaled, sges: [], immOrRkey: 0x80000001 })
    e.addSend({ wrId: 7, opcode: WrOpcode.SendWithInv, flags: 0, sges: [sge(1, 2, 3)], immOrRkey: 0x42 })
    const decoded = decode('send', words(e), e.count)
    expect(decoded).toEqual([
      { wrId: 5n * 2n ** 32n + 7n, opcode: WrOpcode.RdmaWriteWithImm, sendFlags: SendFlags.Signaled | SendFlags.Fence,
        sges: write.map(decodedSge), immData: 0xcafebabe, remoteAddr: 0x7f01fffff000n, rkey: 0xabcdef01 },
      { wrId: 2n, opcode: WrOpcode.RdmaRead, sendFlags: SendFlags.Signaled, sges: [decodedSge(sge(0x3000, 64, 9))], immData: 0, remoteAddr: 0x4000n, rkey: 5 },
      { wrId: 3n, opcode: WrOpcode.AtomicCmpAndSwp, sendFlags: SendFlags.Signaled, sges: [decodedSge(sge(0x2000, 8, 3))], immData: 0,
        remoteAddr: 0x100000002n, rkey: 4, compareAdd: 0x0123456789abcdefn, swap: 0xfedcba9876543210n },
      { wrId: 4n, opcode: WrOpcode.AtomicFetchAndAdd, sendFlags: 0, sges: [decodedSge(sge(0x2008, 8, 3))], immData: 0,
        remoteAddr: 0x10n, rkey: 6, compareAdd: 2n ** 64n - 1n, swap: 0n },
      { wrId: BigInt(Number.MAX_SAFE_INTEGER), opcode: WrOpcode.SendWithImm, sendFlags: SendFlags.Inline, sges: [], immData: 0x01020304,
        hasAh: false, remoteQpn: 0, remoteQkey: 0 },
      { wrId: 6n, opcode: WrOpcode.LocalInv, sendFlags: SendFlags.Signaled, sges: [], invalidateRkey: 0x80000001, hasAh: false, remoteQpn: 0, remoteQkey: 0 },
      { wrId: 7n, opcode: WrOpcode.SendWithInv, sendFlags: 0, sges: [decodedSge(sge(1, 2, 3))], invalidateRkey: 0x42, hasAh: false, remoteQpn: 0, remoteQkey: 0 },
    ])
  })

  it('round-trips 200 writes (the encoder grown twice) and decodes only `count` of them', () => {
    const e = new WorkRequestEncoder()
    for (let i = 0; i < 200; i++) {
      e.addSend({ wrId: i + 1, opcode: WrOpcode.RdmaWrite, flags: 0, sges: [sge(0x1000 * (i + 1), i, i)], remoteLo: i * 8, rkey: i })
    }
    const decoded = decode('send', words(e), e.count)
    expect(decoded.length).toBe(200)
    decoded.forEach((wr, i) => expect(wr).toEqual({ wrId: BigInt(i + 1), opcode: WrOpcode.RdmaWrite, sendFlags: 0,
      sges: [decodedSge(sge(0x1000 * (i + 1), i, i))], immData: 0, remoteAddr: BigInt(i * 8), rkey: i }))
    expect(decode('send', words(e), 3).map((wr) => wr.wrId)).toEqual([1n, 2n, 3n])
  })

  it('round-trips receives with 0, 1 and 64 SGEs', () => {
    const e = new WorkRequestEncoder()
    const many = Array.from({ length: 64 }, (_, i) => sge(2 ** 45 + i * 16, i + 1, 1000 + i))
    e.addRecv(3 * TWO_32 + 1, [sge(2 ** 40 + 0x10, 512, 0x77)])
    e.addRecv(2, [])
    e.addRecv(Number.MAX_SAFE_INTEGER, many)
    expect(decode('recv', words(e), e.count)).toEqual([
      { wrId: 3n * 2n ** 32n + 1n, sges: [decodedSge(sge(2 ** 40 + 0x10, 512, 0x77))] },
      { wrId: 2n, sges: [] },
      { wrId: BigInt(Number.MAX_SAFE_INTEGER), sges: many.map(decodedSge) },
    ])
  })

  it('looks up a UD destination by address-handle id: an unknown id is refused as closed', () => {
    const e = new WorkRequestEncoder()
    e.addSend({ wrId: 1, opcode: WrOpcode.Send, flags: 0, sges: [], ahId: 9, remoteQpn: 0xabcdef, remoteQkey: 0x11111111 })
    expect(thrown(() => decode('send', words(e), 1))).toMatchObject({ code: 'ERR_CLOSED', message: 'AddressHandle is closed' })
  })

  it('decodes the single request of the tagged and fast promise paths (on the stack, as they post it) as the batch decoder does', () => {
    const e = new WorkRequestEncoder()
    const one = (send: Parameters<WorkRequestEncoder['addSend']>[0]) => {
      e.reset()
      e.addSend(send)
      const decoded = decode('one', e.buffer, 1) // the whole buffer, as the bound post sees it
      expect(decoded).toEqual(decode('send', words(e), 1))
      return decoded[0]
    }
    expect(one({ wrId: 2 ** 52 + 9, opcode: WrOpcode.RdmaRead, flags: SendFlags.Signaled, sges: [sge(2 ** 40 + 8, 8, 7)], remoteHi: 3, remoteLo: 4, rkey: 5 }))
      .toEqual({ wrId: 2n ** 52n + 9n, opcode: WrOpcode.RdmaRead, sendFlags: SendFlags.Signaled, sges: [decodedSge(sge(2 ** 40 + 8, 8, 7))], immData: 0, remoteAddr: 0x300000004n, rkey: 5 })
    expect(one({ wrId: 1, opcode: WrOpcode.AtomicFetchAndAdd, flags: SendFlags.Signaled, sges: [sge(0x2000, 8, 3)], remoteLo: 8, rkey: 6, compareAdd: 2n ** 64n - 1n }))
      .toMatchObject({ compareAdd: 2n ** 64n - 1n, swap: 0n, remoteAddr: 8n })
    expect(one({ wrId: 3, opcode: WrOpcode.RdmaWrite, flags: SendFlags.Signaled, sges: [], remoteLo: 16, rkey: 6 }).sges).toEqual([]) // zero-length
    // Four SGEs fit its stack storage; more are refused before anything is posted.
    const four = Array.from({ length: 4 }, (_, i) => sge(0x1000 * (i + 1), 8, i))
    expect(one({ wrId: 4, opcode: WrOpcode.Send, flags: 0, sges: four }).sges).toEqual(four.map(decodedSge))
    e.reset()
    e.addSend({ wrId: 5, opcode: WrOpcode.Send, flags: 0, sges: [...four, sge(1, 1, 1)] })
    expect(thrown(() => decode('one', e.buffer, 1))).toMatchObject({ code: 'ERR_INVALID_ARG_VALUE', message: 'Malformed work request batch: too many SGEs for a single request' })
    e.reset()
    e.addSend({ wrId: 6, opcode: WrOpcode.Send, flags: 0, sges: [sge(1, 1, 1)] })
    expect(thrown(() => decode('one', words(e).subarray(0, 15), 1))).toMatchObject({ message: 'Malformed work request batch: truncated header' })
    expect(thrown(() => decode('one', words(e).subarray(0, 19), 1))).toMatchObject({ message: 'Malformed work request batch: truncated SGE list' })
  })

  describe.each(['send', 'recv'] as const)('malformed %s batches are refused with ERR_INVALID_ARG_VALUE', (kind) => {
    const header = kind === 'send' ? 16 : 4
    const numSgeWord = kind === 'send' ? 4 : 2
    const encode = (count: number, sges: number) => {
      const e = new WorkRequestEncoder()
      for (let i = 0; i < count; i++) {
        const list = Array.from({ length: sges }, (_, j) => sge(0x1000 + j, 8, 1))
        if (kind === 'send') e.addSend({ wrId: i, opcode: WrOpcode.Send, flags: 0, sges: list })
        else e.addRecv(i, list)
      }
      return words(e)
    }
    const malformed = (w: Uint32Array, count: number, what: string) => {
      expect(thrown(() => decode(kind, w, count))).toMatchObject({ code: 'ERR_INVALID_ARG_VALUE', message: `Malformed work request batch: ${what}` })
    }

    it('zero count', () => malformed(encode(1, 1), 0, 'no work requests'))
    it('a header cut short', () => malformed(encode(1, 0).subarray(0, header - 1), 1, 'truncated header'))
    it('a count larger than the requests written', () => malformed(encode(2, 1), 3, 'truncated header'))
    it('an SGE list cut short', () => malformed(encode(1, 2).subarray(0, header + 4 + 3), 1, 'truncated SGE list'))
    it('an SGE count that runs past the end', () => {
      const w = encode(1, 1)
      w[numSgeWord] = 2
      malformed(w, 1, 'truncated SGE list')
    })
    it('more than 64 SGEs', () => {
      const w = encode(1, 0)
      w[numSgeWord] = 65
      malformed(w, 1, 'too many SGEs')
      const wrap = encode(1, 0)
      wrap[numSgeWord] = 0x40000000 // * 4 words would wrap a 32-bit offset to 0
      malformed(wrap, 1, 'too many SGEs')
    })
    it('a Uint32Array is required', () => {
      expect(thrown(() => decode(kind, new Int32Array(header) as unknown as Uint32Array, 1))).toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
    })
  })
})
