// Several rails (options.devices, lib/transfer/rails.ts) without a device:
// the option is checked before anything opens (TCP has no rails: a coded
// refusal, not an option silently ignored), rates measured per rail give
// their shares, and slices are striped in proportion to them. The rails
// moving bytes are proven in test/two-host/60.rails.test.ts (docs/rails.md).
import { describe, expect, it } from 'vitest'
import { TransferAgent } from '../../dist/index.js'
import { RailMeter, railDevices } from '../../lib/transfer/rails.js'
import { agentSettings } from '../../lib/transfer/agent-settings.js'
import { emptyColumns, stripe } from '../../lib/transfer/blocks.js'
import { Resubmits } from '../../lib/transfer/failover.js'

const TYPE = { code: 'ERR_INVALID_ARG_TYPE' }
const VALUE = { code: 'ERR_INVALID_ARG_VALUE' }

describe('options.devices (rails)', () => {
  it('TCP has no rails: devices is refused with ERR_INVALID_ARG_VALUE, and no agent listens', async () => {
    await expect(TransferAgent.create({ host: '127.0.0.1', transport: 'tcp', devices: ['rxe0', 'rxe1'] })).rejects.toMatchObject(VALUE)
  })

  it('refuses what is not a list of 1..4 distinct device names, and devices together with device', () => {
    for (const bad of [[], 'rxe0', [7], [''], ['a', 'b', 'c', 'd', 'e'], null]) {
      expect(() => railDevices(bad, undefined, 'rdma'), JSON.stringify(bad)).toThrow(expect.objectContaining(TYPE))
    }
    expect(() => railDevices(['rxe0', 'rxe0'], undefined, 'rdma')).toThrow(expect.objectContaining(VALUE))
    expect(() => railDevices(['rxe0', 'rxe1'], 'rxe0', 'rdma')).toThrow(expect.objectContaining(VALUE))
    expect(() => railDevices(['rxe0'], undefined, 'tcp')).toThrow(expect.objectContaining(VALUE))
    expect(railDevices(undefined, 'rxe0', 'rdma')).toBeUndefined()
    expect(railDevices(['rxe0', 'rxe1'], undefined, 'auto')).toEqual(['rxe0', 'rxe1'])
  })

  it('create() checks devices before opening any device (a bad list never reaches the verbs)', async () => {
    await expect(TransferAgent.create({ host: '127.0.0.1', devices: ['rxe0', 'rxe0'] })).rejects.toMatchObject(VALUE)
    await expect(TransferAgent.create({ host: '127.0.0.1', devices: 'rxe0' as never })).rejects.toMatchObject(TYPE)
  })
})

describe('options.railRetryMs (how long a failed rail waits before its link is made anew)', () => {
  it('defaults to 5000 ms and takes 0 .. 2^31', () => {
    expect(agentSettings({ host: '127.0.0.1' }, undefined).railRetryMs).toBe(5000)
    expect(agentSettings({ host: '127.0.0.1', railRetryMs: 0 }, undefined).railRetryMs).toBe(0)
    expect(agentSettings({ host: '127.0.0.1', railRetryMs: 250 }, undefined).railRetryMs).toBe(250)
  })

  it('refuses what is not an integer in range, with a coded error naming the option, before anything listens', async () => {
    for (const [bad, code] of [[-1, 'ERR_OUT_OF_RANGE'], [2 ** 31 + 1, 'ERR_OUT_OF_RANGE'], [1.5, 'ERR_OUT_OF_RANGE'], ['5000', 'ERR_INVALID_ARG_TYPE']] as const) {
      const error = await TransferAgent.create({ host: '127.0.0.1', transport: 'tcp', railRetryMs: bad as number }).then(() => undefined, (e: unknown) => e)
      expect(error, JSON.stringify(bad)).toMatchObject({ code })
      expect((error as Error).message).toContain('options.railRetryMs')
    }
  })
})

describe('RailMeter: shares by measured rate', () => {
  it('starts equal, then follows the measured rates (a rail twice as fast gets twice the bytes)', () => {
    const meter = new RailMeter(2)
    expect(meter.shares()).toEqual([0.5, 0.5])
    meter.record(0, 2_000_000, 100) // 20 000 bytes/ms
    meter.record(1, 1_000_000, 100) // 10 000 bytes/ms
    const [a, b] = meter.shares()
    expect(a! / b!).toBeCloseTo(2, 5)
    expect(a! + b!).toBeCloseTo(1, 9)
  })

  it('a rail not measured yet counts as the mean of the others; a slow rail keeps a floor of 5%', () => {
    const meter = new RailMeter(3)
    meter.record(0, 1000, 1)
    meter.record(1, 3000, 1)
    expect(meter.shares().map((s) => Number(s.toFixed(4)))).toEqual([0.1667, 0.5, 0.3333])
    const slow = new RailMeter(2)
    slow.record(0, 1_000_000, 1)
    slow.record(1, 1, 1)
    expect(slow.shares()[1]).toBeCloseTo(0.05, 9)
  })

  it('a rail down gets nothing; its lanes get weight 0', () => {
    const meter = new RailMeter(2)
    meter.markDown(1)
    expect(meter.shares()).toEqual([1, 0])
    expect([...meter.laneWeights(2)]).toEqual([0.5, 0.5, 0, 0])
  })
})

describe('stripe() with weights', () => {
  const slices = (n: number, len: number) => {
    const cols = emptyColumns(n)
    cols.len.fill(len)
    return cols
  }

  it('without weights, as before: equal bytes per QP', () => {
    expect([...stripe(slices(8, 10), 4)]).toEqual([0, 2, 4, 6, 8])
    expect([...stripe(slices(8, 10), 4, [1, 1, 1, 1])]).toEqual([0, 2, 4, 6, 8])
  })

  it('bytes in proportion to the weights; a weight of 0 gives an empty run, the first ones included (rail 0 down)', () => {
    expect([...stripe(slices(12, 10), 2, [2, 1])]).toEqual([0, 8, 12])
    expect([...stripe(slices(12, 10), 4, [0.25, 0.25, 0, 0.5])]).toEqual([0, 3, 6, 6, 12])
    expect([...stripe(slices(4, 10), 2, [0, 1])]).toEqual([0, 0, 4])
    expect([...stripe(slices(1, 10), 4, [0, 0, 0.5, 0.5])]).toEqual([0, 0, 0, 1, 1])
    expect([...stripe(slices(8, 10), 4, [0, 0, 0.5, 0.5])]).toEqual([0, 0, 0, 4, 8])
  })
})

describe('Resubmits: a failed rail\'s slices, posted again', () => {
  it('hands ranges out in batches of at most max, each slice once', () => {
    const redo = new Resubmits(4)
    redo.put(10, 15)
    redo.put(20, 20) // empty: nothing
    redo.put(30, 33)
    const got: number[] = []
    for (let b = redo.take(2); b; b = redo.take(2)) {
      expect(b.to - b.from).toBeLessThanOrEqual(2)
      for (let i = b.from; i < b.to; i++) got.push(i)
    }
    expect(got.sort((a, b) => a - b)).toEqual([10, 11, 12, 13, 14, 30, 31, 32])
    expect(redo.pending).toBe(false)
  })

  it('owes the markers of used lanes whose last batch was not confirmed', () => {
    const redo = new Resubmits(4)
    const bounds = Uint32Array.from([0, 5, 5, 9, 12]) // lane 1 unused
    redo.tailed(0)
    redo.markDown(2)
    redo.markDown(3)
    expect(redo.anyDown).toBe(true)
    expect(redo.owedMarkers(bounds)).toBe(2)
    redo.tailed(3)
    expect(redo.owedMarkers(bounds)).toBe(1)
  })
})
