// PromiseOps: the ring behind the promises' fast path (lib/ops/promise-ops.ts).
// Each request's promise settles exactly once: resolved by its completion
// (an atomic with the value that landed in its slot), rejected by an error
// completion, a refused post, a failed CQ or a destroyed QP; its region is
// held and a library-owned atomic slot kept until the device is done.
import { describe, expect, it } from 'vitest'
import { PromiseOps } from '../../lib/ops/promise-ops.js'
import { PROMISE_WR_ID_BASE } from '../../lib/ops/wr-ids.js'
import { readU64LE } from '../../lib/core/u64.js'
import { fakeRegion, type FakeRegion } from './fake-region.js'
import { TAGGED_FETCH_ADD, TAGGED_READ, TAGGED_WRITE } from '../../lib/ops/tagged-ops.js'
import { RdmaError } from '../../lib/core/errors.js'
import type { CompletionEntry } from '../../lib/ops/pending.js'

function setup(capacity: number) {
  const region = fakeRegion(64)
  const owner = { finished: 0, failures: [] as string[], ringRequestFinished() { this.finished++ }, failed(e: RdmaError) { this.failures.push(e.code!) } }
  const returned: unknown[] = []
  // A slot given back is soon reused: scribbled on here, so a value read after that is wrong.
  type Slot = { region: FakeRegion; offset: number; length: number }
  const ops = new PromiseOps<Slot>(owner, {
    returnAtomicSlot: (slot) => { returned.push(slot); region.bytes.fill(0xff, slot.offset, slot.offset + 8) },
    readAtomicValue: (slot) => readU64LE(slot.region.bytes, slot.offset),
  }, capacity)
  const entry = (wrId: number, status = 0) => ({ wrId, status, qpn: 1, vendorError: 0 }) as CompletionEntry
  const slot = (offset: number): Slot => ({ region, offset, length: 8 })
  return { region, owner, ops, entry, slot, returned }
}

/** Watches how a promise settles (a handler attached at once, so no rejection goes unhandled). */
function watch(promise: Promise<unknown>): { now: () => Promise<string> } {
  let outcome = 'pending'
  promise.then((v) => { outcome = `resolved ${String(v)}` }, (e: RdmaError) => { outcome = `rejected ${e.code}` })
  // After a macrotask turn every settled promise has run its handlers.
  return { now: async () => { await new Promise((resolve) => setImmediate(resolve)); return outcome } }
}

describe('PromiseOps', () => {
  it('resolves each request once, by its wr_id, and holds its region until then; through many laps of the ring', async () => {
    const { region, owner, ops, entry } = setup(3) // a ring of 4
    for (let lap = 0; lap < 50; lap++) {
      const promises = [watch(ops.add(region, TAGGED_WRITE)), watch(ops.add(region, TAGGED_READ))]
      const ids = [ops.lastWrId - 1, ops.lastWrId]
      expect(ids[0]).toBe(ops.wrIdBase + 2 * lap)
      expect(region.inflight).toBe(2)
      expect(await promises[0]!.now()).toBe('pending')
      for (const id of ids) ops.complete(entry(id))
      ops.complete(entry(ids[0]!)) // a second completion for a finished request: ignored
      expect(ops.inFlight).toBe(0)
      expect(await Promise.all(promises.map((p) => p.now()))).toEqual(['resolved undefined', 'resolved undefined'])
    }
    expect(region.inflight).toBe(0)
    expect(ops.inFlight).toBe(0)
    expect(owner.finished).toBe(100)
  })

  it('ignores wr_ids it never gave out (the same slot another lap, or below its range)', async () => {
    const { region, ops, entry } = setup(4)
    const promise = watch(ops.add(region, TAGGED_WRITE))
    const id = ops.lastWrId
    ops.complete(entry(id + 4))
    ops.complete(entry(PROMISE_WR_ID_BASE - 1))
    expect(await promise.now()).toBe('pending')
    ops.complete(entry(id))
    expect(await promise.now()).toBe('resolved undefined')
  })

  it('an atomic resolves with the value in its slot, read before a library-owned slot is given back; a caller-owned one is not', async () => {
    const { region, ops, entry, slot, returned } = setup(4)
    new DataView(region.bytes.buffer).setBigUint64(8, 0x1_0000_0002n, true)
    const owned = slot(8)
    const promise = watch(ops.addAtomic(owned, true, TAGGED_FETCH_ADD))
    ops.complete(entry(ops.lastWrId))
    expect(await promise.now()).toBe(`resolved ${0x1_0000_0002n}`)
    expect(returned).toEqual([owned])
    const mine = watch(ops.addAtomic(slot(16), false, TAGGED_FETCH_ADD))
    ops.complete(entry(ops.lastWrId))
    expect(await mine.now()).toBe('resolved 0')
    expect(returned).toEqual([owned])
  })

  it('an error completion rejects with its status, fails the QP (not for a flush), releases, and gives the atomic slot back', async () => {
    const { region, owner, ops, entry, slot, returned } = setup(4)
    const aPromise = ops.add(region, TAGGED_WRITE)
    const a = watch(aPromise)
    const aId = ops.lastWrId
    const b = watch(ops.addAtomic(slot(0), true, TAGGED_FETCH_ADD))
    const bId = ops.lastWrId
    ops.complete(entry(aId, 10)) // REM_ACCESS_ERR
    ops.complete(entry(bId, 5)) // WR_FLUSH_ERR
    expect(await a.now()).toBe('rejected REM_ACCESS_ERR')
    expect(await b.now()).toBe('rejected WR_FLUSH_ERR')
    expect((await aPromise.catch((e: RdmaError) => e))).toMatchObject({ verb: 'write', status: 'REM_ACCESS_ERR' })
    expect(owner.failures).toEqual(['REM_ACCESS_ERR'])
    expect(region.inflight).toBe(0)
    expect(returned.length).toBe(1)
  })

  it('refuse() rejects a request the provider refused and frees its slot', async () => {
    const { region, owner, ops } = setup(4)
    const promise = watch(ops.add(region, TAGGED_READ))
    ops.refuse(ops.lastWrId, new RdmaError('refused', { code: 'ENOMEM' }))
    expect(await promise.now()).toBe('rejected ENOMEM')
    expect(region.inflight).toBe(0)
    expect(owner.finished).toBe(1)
    expect(owner.failures).toEqual([])
  })

  it('reportAll (the CQ failed) rejects now and keeps the memory; abandonAll (the QP closed) releases, rejecting only what was not rejected', async () => {
    const { region, ops, entry, slot, returned } = setup(4)
    const aPromise = ops.add(region, TAGGED_WRITE)
    const a = watch(aPromise)
    const aId = ops.lastWrId
    const b = watch(ops.addAtomic(slot(0), true, TAGGED_FETCH_ADD))
    ops.reportAll(new RdmaError('cq failed', { code: 'ERR_CQ' }))
    expect(await a.now()).toBe('rejected ERR_CQ')
    expect(await b.now()).toBe('rejected ERR_CQ')
    expect(region.inflight).toBe(2) // the device may still use it
    expect(returned).toEqual([])
    ops.complete(entry(aId)) // its completion came after all: released, not settled again
    expect(region.inflight).toBe(1)
    const c = watch(ops.add(region, TAGGED_READ))
    ops.abandonAll(new RdmaError('closed', { code: 'ERR_CLOSED' }))
    expect(await c.now()).toBe('rejected ERR_CLOSED')
    expect(region.inflight).toBe(0)
    expect(returned.length).toBe(1)
    expect(ops.inFlight).toBe(0)
  })
})
