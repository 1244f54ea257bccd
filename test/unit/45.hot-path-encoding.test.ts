// The hot paths write work requests straight into the send buffer
// (WorkRequestEncoder.addOne / setAtomicOperands) instead of building wr and
// sge objects for addSend: both must produce the same words.
import { describe, expect, it } from 'vitest'
import { WorkRequestEncoder, type SendWr } from '../../lib/ops/encoder.js'
import { SendFlags, WrOpcode } from '../../lib/core/constants.js'
import { smallU64 } from '../../lib/core/u64.js'
import type { LocalSlice } from '../../lib/verbs/memory.js'
import type { RemoteSlice } from '../../lib/verbs/remote.js'

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
    e.setAtomicOperands(at, compareAdd, smallU64(compareAdd, 'compare'), swap, smallU64(swap, 'swap'))
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

describe('WorkRequestEncoder.addSliceColumns (postBatch\'s hot path)', () => {
  // The words the native decoder reads: header 0-4, the immediate 5 (for the opcodes that carry it),
  // remote 6-8 (RDMA opcodes only), the AH id 13, the SGE 16-19.
  const RDMA_WORDS = [0, 1, 2, 3, 4, 6, 7, 8, 13, 16, 17, 18, 19]
  const SEND_WORDS = [0, 1, 2, 3, 4, 13, 16, 17, 18, 19]
  const WITH_IMM: number[] = [WrOpcode.RdmaWriteWithImm, WrOpcode.SendWithImm]
  const wordsOf = (opcode: number) => {
    const words = opcode === WrOpcode.Send || opcode === WrOpcode.SendWithImm ? SEND_WORDS : RDMA_WORDS
    return WITH_IMM.includes(opcode) ? [...words, 5] : words
  }
  const pick = (words: Uint32Array, at: number, which: number[]) => which.map((k) => words[at + k])
  const region = { address: 0x7f0012340000, lkey: 0x1234 }
  const local = (offset: number, length: number) => ({ region, offset, length }) as unknown as LocalSlice
  const remote = (addrLo: number, addrHi: number) => ({ addrLo, addrHi, region: { rkey: 0xabcdef01 } }) as unknown as RemoteSlice

  it.each([false, true])('writes what addOne writes for each request (signalEach %s), wr_ids across 2^32', (signalEach) => {
    const first = TWO_32 - 3
    const locals = [local(0, 8), local(8, 16), local(4096, 1 << 20), local(64, 32), local(128, 4)]
    const remotes = [remote(0xfffff000, 0x7f01), remote(0x10, 0x7f01), remote(0x2000, 0x1), undefined, undefined]
    const opcodes = [WrOpcode.RdmaWrite, WrOpcode.RdmaRead, WrOpcode.RdmaWriteWithImm, WrOpcode.SendWithImm, WrOpcode.Send]
    const imms = [0, 0, 0xdeadbeef, 7, 0]
    const e = new WorkRequestEncoder()
    e.addOne(1, WrOpcode.RdmaWrite, 0, 0x1000, 8, 1, 0, 0, 2, 0) // a request before the batch
    e.addSliceColumns(first, 5, locals, remotes, opcodes, imms, SendFlags.Fence, signalEach)
    expect(e.count).toBe(6)
    expect(e.used).toBe(6 * 20)
    for (let i = 0; i < 5; i++) {
      const one = new WorkRequestEncoder()
      const flags = signalEach || i === 4 ? SendFlags.Fence | SendFlags.Signaled : SendFlags.Fence
      const r = remotes[i]
      one.addOne(first + i, opcodes[i]!, flags, region.address + locals[i]!.offset, locals[i]!.length,
        region.lkey, r?.addrLo ?? 0, r?.addrHi ?? 0, r ? 0xabcdef01 : 0, imms[i]!)
      const which = wordsOf(opcodes[i]!)
      expect(pick(e.buffer, 20 * (i + 1), which), `request ${i}`).toEqual(pick(one.buffer, 0, which))
    }
  })
})


describe('WorkRequestEncoder.setOnly (the tagged path)', () => {
  const READ_WORDS = [0, 1, 2, 3, 4, 6, 7, 8, 13, 16, 17, 18, 19]
  const ATOMIC_WORDS = [...READ_WORDS, 9, 10, 11, 12]
  const pick = (words: Uint32Array, which: number[]) => which.map((k) => words[k])
  const region = { address: 0x7f0012340000, lkey: 0x1234 }
  const local = { region, offset: 0x18, length: 8 } as unknown as LocalSlice
  const remote = { addrLo: 0xfffff008, addrHi: 0x7f01, rkey: 0xabcdef01 } as unknown as RemoteSlice

  it.each([
    ['READ', WrOpcode.RdmaRead, READ_WORDS],
    ['WRITE', WrOpcode.RdmaWrite, READ_WORDS],
    ['FETCH_AND_ADD', WrOpcode.AtomicFetchAndAdd, ATOMIC_WORDS],
  ])('writes what addOne writes for a %s, as the only request, over what earlier requests left', (_name, opcode, which) => {
    const wrId = 2 ** 52 + TWO_32 + 5
    const e = new WorkRequestEncoder()
    for (let i = 0; i < 2; i++) { // leave every word of two requests set, and inline data marked
      const junk = e.addOne(9, WrOpcode.AtomicCmpAndSwp, SendFlags.Fence | SendFlags.Inline, 0x1000, 8, 1, 3, 4, 2, 7)
      e.setAtomicOperands(junk, 0xffff_ffff_ffff_ffffn, -1, 0x1_0000_0000n, -1)
    }
    e.setOnly(wrId, opcode, local, remote)
    if (opcode === WrOpcode.AtomicFetchAndAdd) e.setAtomicOperands(0, 5n, 5, 0n, 0)
    expect([e.count, e.used, e.hasInline]).toEqual([1, 20, false])
    const one = new WorkRequestEncoder()
    one.addOne(wrId, opcode, SendFlags.Signaled, region.address + 0x18, 8, region.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
    if (opcode === WrOpcode.AtomicFetchAndAdd) one.setAtomicOperands(0, 5n, 5, 0n, 0)
    expect(pick(e.buffer, which)).toEqual(pick(one.buffer, which))
  })
})

describe('WorkRequestEncoder buffers (the addon keeps pointers into them)', () => {
  it('cannot be detached by a transfer, the first buffer nor one grown later (structuredClone copies them)', () => {
    const encoder = new WorkRequestEncoder()
    const first = encoder.buffer
    structuredClone(first, { transfer: [first.buffer as ArrayBuffer] }) // an ArrayBuffer: the encoder never uses shared memory
    expect(first.byteLength).toBeGreaterThan(0)
    const wr: SendWr = { wrId: 1, opcode: WrOpcode.RdmaWrite, flags: SendFlags.Signaled, sges: [{ address: 4096, length: 8, lkey: 1 }], remoteHi: 0, remoteLo: 0, rkey: 2 }
    while (encoder.buffer === first) encoder.addSend(wr) // until it grows
    const grown = encoder.buffer
    structuredClone(grown, { transfer: [grown.buffer as ArrayBuffer] })
    expect(grown.byteLength).toBeGreaterThan(first.byteLength)
  })
})
