// PendingTable: the ring that indexes requests in flight by their last
// wr_id, with a Map for ids that land on a taken slot.
import { describe, expect, it } from 'vitest'
import { PendingTable } from '../../lib/ops/pending-table.js'
import type { Pending } from '../../lib/ops/pending.js'

const request = (firstWrId: number, lastWrId = firstWrId) =>
  ({ firstWrId, lastWrId, contains: (id: number) => id >= firstWrId && id <= lastWrId }) as unknown as Pending

describe('PendingTable', () => {
  it('finds, counts and removes requests by their last wr_id', () => {
    const table = new PendingTable(16)
    const a = request(1, 3), b = request(4)
    table.set(3, a)
    table.set(4, b)
    expect(table.size).toBe(2)
    expect(table.get(3)).toBe(a)
    expect(table.get(4)).toBe(b)
    expect(table.get(1)).toBeUndefined() // not a last wr_id
    expect(table.containing(1)).toBe(a)
    expect(table.containing(2)).toBe(a)
    table.delete(3)
    expect(table.get(3)).toBeUndefined()
    expect(table.containing(2)).toBeUndefined()
    expect(table.size).toBe(1)
    expect(table.values()).toEqual([b])
  })

  it('keeps requests whose wr_ids share a slot (a Map beside the ring)', () => {
    const table = new PendingTable(16) // 64 slots
    const old = request(5), young = request(5 + 64), younger = request(5 + 128)
    table.set(5, old)
    table.set(69, young)
    table.set(133, younger)
    expect([table.get(5), table.get(69), table.get(133)]).toEqual([old, young, younger])
    table.delete(5) // the ring's slot frees; the others stay found
    expect([table.get(5), table.get(69), table.get(133)]).toEqual([undefined, young, younger])
    table.delete(133)
    expect(table.get(69)).toBe(young)
    expect(table.size).toBe(1)
    expect(table.containing(69)).toBe(young)
  })

  it('takes wr_ids past 2^32 (the counter is a double)', () => {
    const table = new PendingTable(1)
    const far = 2 ** 40 + 7
    const p = request(far - 2, far)
    table.set(far, p)
    expect(table.get(far)).toBe(p)
    expect(table.get(7)).toBeUndefined()
    expect(table.containing(far - 1)).toBe(p)
    table.delete(far)
    expect(table.size).toBe(0)
  })
})
