// The hot paths write work requests straight into the send buffer
// (WorkRequestEncoder.addOne / setAtomicOperands) instead of building wr and
// sge objects for addSend: both must produce the same words.
import { describe, expect, it } from 'vitest'
import { WorkRequestEncoder, type SendWr } from '../../lib/work-request-encoding.js'
import { SendFlags, WrOpcode } from '../../lib/constants.js'

const TWO_32 = 2 ** 32

function viaAddSend(wr: SendWr): number[] {
  const e = new WorkRequestEncoder()
  e.addSend(wr)
  return Array.from(e.buffer.subarray(0, e.used))
}

describe('WorkRequestEncoder.addOne', () => {
  it.each([
    ['READ', WrOpcode.RdmaRead],
    ['WRITE', WrOpcode.RdmaWrite],
  ])('encodes an 8-byte %s as addSend does', (_name, opcode) => {
    const wrId = 3 * TWO_32 + 9
    const e = new WorkRequestEncoder()
    const at = e.addOne(wrId, opcode, SendFlags.Signaled, 0x7f0012345008, 8, 0x1234, 0xfffff000, 0x7f01, 0xabcdef01, 0)
    expect(at).toBe(0)
    expect(e.count).toBe(1)
    expect(Array.from(e.buffer.subarray(0, e.used))).toEqual(viaAddSend({
      wrId, opcode, flags: SendFlags.Signaled, sges: [{ address: 0x7f0012345008, length: 8, lkey: 0x1234 }],
      remoteLo: 0xfffff000, remoteHi: 0x7f01, rkey: 0xabcdef01,
    }))
  })

  it('encodes a zero-length request without an SGE, and returns where each request starts', () => {
    const e = new WorkRequestEncoder()
    e.addOne(1, WrOpcode.RdmaWrite, SendFlags.Signaled, 0x1000, 8, 1, 0, 0, 2, 0)
    const at = e.addOne(2, WrOpcode.RdmaWrite, SendFlags.Signaled, 0x1000, 0, 1, 0, 0, 2, 0)
    expect(at).toBe(20) // 16 header words + 4 SGE words
    expect(e.used).toBe(36)
    expect(Array.from(e.buffer.subarray(at, e.used))).toEqual(viaAddSend({ wrId: 2, opcode: WrOpcode.RdmaWrite, flags: SendFlags.Signaled, sges: [], remoteLo: 0, remoteHi: 0, rkey: 2 }))
  })

  it.each([
    ['CMP_AND_SWP', WrOpcode.AtomicCmpAndSwp, 0x1_0000_0002n, 0xffff_ffff_ffff_ffffn],
    ['FETCH_AND_ADD', WrOpcode.AtomicFetchAndAdd, 5n, 0n],
  ])('encodes a %s with its 64-bit operands as addSend does', (_name, opcode, compareAdd, swap) => {
    const e = new WorkRequestEncoder()
    const at = e.addOne(77, opcode, SendFlags.Signaled, 0x2000, 8, 9, 0x40, 0x1, 0x55, 0)
    e.setAtomicOperands(at, compareAdd, swap)
    expect(Array.from(e.buffer.subarray(0, e.used))).toEqual(viaAddSend({
      wrId: 77, opcode, flags: SendFlags.Signaled, sges: [{ address: 0x2000, length: 8, lkey: 9 }],
      remoteLo: 0x40, remoteHi: 0x1, rkey: 0x55, compareAdd, swap,
    }))
  })

  it('marks inline data, so that the queue pair posts it at once', () => {
    const e = new WorkRequestEncoder()
    e.addOne(1, WrOpcode.RdmaWrite, SendFlags.Signaled | SendFlags.Inline, 0x1000, 8, 1, 0, 0, 2, 0)
    expect(e.hasInline).toBe(true)
  })

  it('grows the buffer (a new Uint32Array) and keeps what was written', () => {
    const e = new WorkRequestEncoder()
    const first = e.buffer
    for (let i = 0; i < 60; i++) e.addOne(i, WrOpcode.RdmaWrite, SendFlags.Signaled, 0x1000 + i, 8, 1, 0, 0, 2, 0)
    expect(e.buffer).not.toBe(first) // 60 * 20 words > 1024: the queue pair must bind the new buffer
    expect(e.buffer[59 * 20]).toBe(59)
    expect(e.buffer[59 * 20 + 16]).toBe(0x1000 + 59)
  })
})
