// The transfer benchmark's block layout: random, repeatable, non-contiguous,
// every block inside its segment and no two blocks overlapping on either side.
import { describe, expect, it } from 'vitest'
import { kvLayout } from '../../lib/cli/bench-transfer.js'

describe('kvLayout', () => {
  it('places each block in a distinct slot: local slots of the transfer, remote slots of a pool twice as large', () => {
    const blocks = 1024, size = 4096
    const { localOffsets, remoteOffsets } = kvLayout(blocks, size, 7)
    const local = new Set(Array.from(localOffsets, (o) => o / size))
    const remote = new Set(Array.from(remoteOffsets, (o) => o / size))
    expect(local.size).toBe(blocks)
    expect(remote.size).toBe(blocks)
    expect(Math.max(...local)).toBe(blocks - 1)
    expect(Math.max(...remote)).toBeLessThan(2 * blocks)
    for (const o of [...localOffsets, ...remoteOffsets]) expect(o % size).toBe(0)
  })

  it('is random but repeatable, and rarely contiguous on both sides', () => {
    const a = kvLayout(512, 16384, 3)
    expect(kvLayout(512, 16384, 3)).toEqual(a)
    expect(kvLayout(512, 16384, 4).remoteOffsets).not.toEqual(a.remoteOffsets)
    let touching = 0
    for (let i = 1; i < 512; i++) {
      if (a.localOffsets[i] === a.localOffsets[i - 1]! + 16384 && a.remoteOffsets[i] === a.remoteOffsets[i - 1]! + 16384) touching++
    }
    expect(touching).toBeLessThan(8) // the engine coalesces those: the bench is about scattered blocks
  })
})
