// Layer 4: the word layout of encoded work requests. It must match
// native/work_request.{h,cc}: send header 16 words, recv header 4 words, SGE
// 4 words (addr lo, addr hi, length, lkey); 64-bit values as lo, hi.
import { describe, expect, it } from 'vitest'
import { WorkRequestEncoder } from '../../lib/work-request-encoding.js'
import { SendFlags, WrOpcode } from '../../lib/constants.js'

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
