// TaggedOps: the ring of tagged requests in flight (lib/ops/tagged-ops.ts). Each
// request is reported exactly once, by the tag it was posted with; wr_ids of
// finished or foreign requests are ignored; reports found by a post are held
// and delivered after it, in order.
import { describe, expect, it } from 'vitest'
import { TAGGED_VERBS, TaggedOps } from '../../lib/ops/tagged-ops.js'
import { PROMISE_WR_ID_BASE, RING_GENERATIONS, RING_SEQUENCES, TAGGED_WR_ID_BASE, nextSequence } from '../../lib/ops/wr-ids.js'
import { CompletionDispatch } from '../../lib/ops/dispatch.js'
import { fakeRegion } from './fake-region.js'
import { RdmaError } from '../../lib/core/errors.js'
import type { CompletionEntry } from '../../lib/ops/pending.js'

const WRITE = TAGGED_VERBS.indexOf('write')
const READ = TAGGED_VERBS.indexOf('read')

function setup(capacity: number) {
  const region = fakeRegion()
  const dispatch = new CompletionDispatch(4)
  const owner = { finished: 0, failures: [] as string[], ringRequestFinished() { this.finished++ }, failed(e: RdmaError) { this.failures.push(e.code!) } }
  const reports: Array<[number, string | undefined]> = []
  const ops = new TaggedOps(owner, (tag, error) => reports.push([tag, error?.code]), capacity, dispatch)
  const entry = (wrId: number, status = 0) => ({ wrId, status, qpn: 1, vendorError: 0 }) as CompletionEntry
  return { region, owner, reports, ops, entry, dispatch }
}

describe('TaggedOps', () => {
  it('reports each request once by its tag, and holds its region until then; through many laps of the ring', () => {
    const { region, owner, reports, ops, entry } = setup(3) // a ring of 4
    for (let lap = 0; lap < 50; lap++) {
      const ids = [ops.add(region, 3 * lap, WRITE), ops.add(region, 3 * lap + 1, READ), ops.add(region, 3 * lap + 2, WRITE)]
      expect(region.inflight).toBe(3)
      expect(ops.inFlight).toBe(3)
      for (const id of ids) ops.complete(entry(id))
      ops.complete(entry(ids[0]!)) // a second completion for a finished request: ignored
    }
    expect(reports).toEqual(Array.from({ length: 150 }, (_, i) => [i, undefined]))
    expect(region.inflight).toBe(0)
    expect(owner.finished).toBe(150)
  })

  it('ignores wr_ids it never gave out (stale, or below the tagged range)', () => {
    const { region, reports, ops, entry } = setup(4)
    const id = ops.add(region, 9, WRITE)
    ops.complete(entry(id + 4)) // the same slot, another sequence number
    ops.complete(entry(TAGGED_WR_ID_BASE - 1))
    expect(reports).toEqual([])
    ops.complete(entry(id))
    expect(reports).toEqual([[9, undefined]])
  })

  it('an error completion reports the error, fails the QP (not for a flush) and still releases', () => {
    const { region, owner, reports, ops, entry } = setup(4)
    const a = ops.add(region, 1, WRITE)
    const b = ops.add(region, 2, READ)
    ops.complete(entry(a, 10)) // REM_ACCESS_ERR
    ops.complete(entry(b, 5)) // WR_FLUSH_ERR
    expect(reports).toEqual([[1, 'REM_ACCESS_ERR'], [2, 'WR_FLUSH_ERR']])
    expect(owner.failures).toEqual(['REM_ACCESS_ERR'])
    expect(region.inflight).toBe(0)
  })

  it('abandonAll reports the rest after the current call, once; a request already reported by reportAll is not reported again', async () => {
    const { region, reports, ops, entry } = setup(4)
    const a = ops.add(region, 1, WRITE)
    ops.add(region, 2, WRITE)
    ops.reportAll(new RdmaError('cq failed', { code: 'ERR_CQ' }))
    expect(reports).toEqual([])
    await Promise.resolve()
    expect(reports).toEqual([[1, 'ERR_CQ'], [2, 'ERR_CQ']])
    ops.complete(entry(a)) // its completion came after all: not reported twice
    ops.add(region, 3, WRITE)
    ops.abandonAll(new RdmaError('closed', { code: 'ERR_CLOSED' }))
    expect(region.inflight).toBe(0)
    await Promise.resolve()
    expect(reports).toEqual([[1, 'ERR_CQ'], [2, 'ERR_CQ'], [3, 'ERR_CLOSED']])
  })

  it('reports found while a post dispatches are held, then delivered in order by deliverHeld() or a microtask', async () => {
    const { region, reports, ops, entry, dispatch } = setup(8)
    const ids = [1, 2, 3].map((tag) => ops.add(region, tag, WRITE))
    dispatch.holding = true
    try {
      for (const id of ids.slice(0, 2)) ops.complete(entry(id))
    } finally {
      dispatch.holding = false
    }
    expect(reports).toEqual([])
    expect(dispatch.reportsHeld).toBe(true)
    dispatch.deliverHeld() // what cq.poll() does
    expect(reports).toEqual([[1, undefined], [2, undefined]])
    dispatch.holding = true
    ops.complete(entry(ids[2]!))
    dispatch.holding = false
    await Promise.resolve()
    expect(reports).toEqual([[1, undefined], [2, undefined], [3, undefined]])
    expect(dispatch.reportsHeld).toBe(false)
  })

  it('never takes a wr_id of another ring (a destroyed QP whose number a new QP got, on the same CQ) as its own', () => {
    // Completions are routed by QP number: one left in the CQ by a destroyed
    // QP reaches the new QP's ring, which must not settle a request with it.
    const old = setup(4)
    const fresh = setup(4)
    const stale = old.ops.add(old.region, 1, WRITE)
    const id = fresh.ops.add(fresh.region, 2, READ)
    fresh.ops.complete(fresh.entry(stale, 10)) // REM_ACCESS_ERR, from the old QP
    expect(fresh.reports).toEqual([])
    expect(fresh.owner.failures).toEqual([])
    fresh.ops.complete(fresh.entry(id))
    expect(fresh.reports).toEqual([[2, undefined]])
  })

  it('gives each ring its own id range: a sequence wraps at 2^32 inside it, and the last range stays below 2^53', () => {
    expect(nextSequence(0)).toBe(1)
    expect(nextSequence(RING_SEQUENCES - 1)).toBe(0)
    const a = setup(4).ops.wrIdBase
    const b = setup(4).ops.wrIdBase
    expect(Math.abs(b - a)).toBeGreaterThanOrEqual(RING_SEQUENCES)
    for (const base of [PROMISE_WR_ID_BASE, TAGGED_WR_ID_BASE]) {
      expect(base + (RING_GENERATIONS - 1) * RING_SEQUENCES + RING_SEQUENCES - 1).toBeLessThan(base * 2)
    }
  })
})
