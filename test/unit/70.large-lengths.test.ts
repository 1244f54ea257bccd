// Layer 7: lengths of 2^32 and more. An SGE's length field has 32 bits: the
// encoder must refuse (not truncate) more, and writes/reads over the max
// message size are split into requests that cover the same bytes in order.
import { describe, expect, it } from 'vitest'
import { thrown } from './thrown.js'
import { WorkRequestEncoder, type SendWr } from '../../lib/ops/encoder.js'
import { MAX_SGE_BYTES, splitWr } from '../../lib/ops/split.js'
import { SendFlags, WrOpcode } from '../../lib/core/constants.js'

const TWO_32 = 2 ** 32
const GiB = 2 ** 30
const MiB = 2 ** 20

const write = (length: number, extra: Partial<SendWr> = {}): SendWr => ({
  wrId: 0, opcode: WrOpcode.RdmaWrite, flags: SendFlags.Signaled, rkey: 0x1234,
  sges: [{ address: 0x7f0000000000, length, lkey: 7 }], remoteHi: 0x55, remoteLo: 0x1000, ...extra,
})

/** Remote address of a piece as a number (exact below 2^53). */
const remoteOf = (wr: SendWr): number => wr.remoteHi! * TWO_32 + wr.remoteLo!
const total = (wr: SendWr): number => wr.sges.reduce((sum, sge) => sum + sge.length, 0)

describe('the encoder at the 2^32 boundary', () => {
  it('encodes an SGE of 2^32 - 1 bytes exactly', () => {
    const e = new WorkRequestEncoder()
    e.addSend(write(MAX_SGE_BYTES))
    expect(e.buffer[16 + 2]).toBe(0xffffffff)
    e.addRecv(1, [{ address: 0x1000, length: MAX_SGE_BYTES, lkey: 1 }])
    expect(e.count).toBe(2)
  })

  it.each([TWO_32, TWO_32 + 1, 4 * GiB + MiB])('refuses an SGE of %d bytes instead of truncating it', (length) => {
    const send = thrown(() => new WorkRequestEncoder().addSend(write(length)))
    expect(send.code).toBe('ERR_SGE_TOO_LARGE')
    const recv = thrown(() => new WorkRequestEncoder().addRecv(1, [{ address: 0x1000, length, lkey: 1 }]))
    expect(recv.code).toBe('ERR_SGE_TOO_LARGE')
  })
})

describe('splitWr', () => {
  it('cuts 4 GiB + 1 MiB into 2 GiB pieces that continue the remote address', () => {
    const pieces = splitWr(write(4 * GiB + MiB), 4 * GiB + MiB, 2 * GiB)
    expect(pieces.map(total)).toEqual([2 * GiB, 2 * GiB, MiB])
    expect(pieces.map((p) => p.sges[0]!.address - 0x7f0000000000)).toEqual([0, 2 * GiB, 4 * GiB])
    expect(pieces.map((p) => remoteOf(p) - (0x55 * TWO_32 + 0x1000))).toEqual([0, 2 * GiB, 4 * GiB])
    expect(pieces.every((p) => p.rkey === 0x1234 && p.sges[0]!.lkey === 7)).toBe(true)
    expect(pieces.map((p) => p.flags & SendFlags.Signaled)).toEqual([0, 0, SendFlags.Signaled])
  })

  it('carries the remote address across 2^32 and never makes an SGE over 2^32 - 1', () => {
    const pieces = splitWr(write(TWO_32 + 10, { remoteHi: 1, remoteLo: 0xfffffff0 }), TWO_32 + 10, TWO_32)
    expect(pieces.map(total)).toEqual([MAX_SGE_BYTES, 11])
    expect(pieces[1]!.remoteHi).toBe(2) // 0x1_fffffff0 + 0xffffffff = 0x2_ffffffef
    expect(pieces[1]!.remoteLo).toBe(0xffffffef)
    const e = new WorkRequestEncoder()
    for (const p of pieces) e.addSend(p)
    expect(e.count).toBe(2)
  })

  it('cuts a gather list at the same byte offsets, with no more SGEs than it had', () => {
    const sges = [
      { address: 0x10000, length: 3 * GiB, lkey: 1 },
      { address: 0x900000000, length: 2 * GiB, lkey: 2 },
      { address: 0xa00000000, length: 5, lkey: 3 },
    ]
    const length = 5 * GiB + 5
    const pieces = splitWr(write(0, { sges }), length, 2 * GiB)
    expect(pieces.map(total)).toEqual([2 * GiB, 2 * GiB, GiB + 5])
    expect(pieces.map((p) => p.sges.map((s) => [s.address, s.length, s.lkey]))).toEqual([
      [[0x10000, 2 * GiB, 1]],
      [[0x10000 + 2 * GiB, GiB, 1], [0x900000000, GiB, 2]],
      [[0x900000000 + GiB, GiB, 2], [0xa00000000, 5, 3]],
    ])
    expect(pieces.every((p) => p.sges.length <= sges.length)).toBe(true)
  })

  it('keeps FENCE on the first piece, and SOLICITED and the immediate on the last', () => {
    const flags = SendFlags.Signaled | SendFlags.Fence | SendFlags.Solicited
    const pieces = splitWr(write(5, { opcode: WrOpcode.RdmaWriteWithImm, immOrRkey: 0xbeef, flags }), 5, 2)
    expect(pieces.map((p) => p.opcode)).toEqual([WrOpcode.RdmaWrite, WrOpcode.RdmaWrite, WrOpcode.RdmaWriteWithImm])
    expect(pieces.map((p) => p.immOrRkey)).toEqual([undefined, undefined, 0xbeef])
    expect(pieces.map((p) => p.flags)).toEqual([SendFlags.Fence, 0, SendFlags.Signaled | SendFlags.Solicited])
    const reads = splitWr(write(5, { opcode: WrOpcode.RdmaRead, flags: 0 }), 5, 2)
    expect(reads.map((p) => [p.opcode, p.flags])).toEqual([[WrOpcode.RdmaRead, 0], [WrOpcode.RdmaRead, 0], [WrOpcode.RdmaRead, 0]])
  })

  it('leaves an operation that fits alone, and refuses a max of 0', () => {
    expect(splitWr(write(4096), 4096, 2 * GiB).map(total)).toEqual([4096])
    expect(() => splitWr(write(1), 1, 0)).toThrow(RangeError)
  })
})
