// CompletionDispatch (lib/ops/dispatch.ts): the one reader of a CQ's output
// words. Entries are written into its words as the addon writes them; the
// owners are fakes that record what they were given.
import { afterEach, describe, expect, it } from 'vitest'
import { CompletionDispatch } from '../../lib/ops/dispatch.js'
import type { CompletionEntry } from '../../lib/ops/pending.js'
import { COMPLETION_WORDS } from '../../lib/native/addon.js'

/** Writes completions (wr_id, qpn, status) into the words from index 0, as a native poll does. */
function polled(dispatch: CompletionDispatch, entries: Array<[wrId: number, qpn: number, status?: number]>): number {
  entries.forEach(([wrId, qpn, status = 0], i) => {
    const o = i * COMPLETION_WORDS
    dispatch.words.fill(0, o, o + COMPLETION_WORDS)
    dispatch.words[o] = wrId
    dispatch.words[o + 2] = status
    dispatch.words[o + 6] = qpn
  })
  dispatch.countWord[0] = entries.length
  return entries.length
}

function owner(onComplete: (entry: CompletionEntry) => void) {
  return { pendingFor: () => ({ complete: onComplete }), failAll: () => {} }
}

const uncaught: unknown[] = []
const onUncaught = (error: unknown) => { uncaught.push(error) }
afterEach(() => {
  process.off('uncaughtException', onUncaught)
  uncaught.length = 0
})

describe('CompletionDispatch', () => {
  it('a delivery that asks for the rest of the batch (a handler\'s cq.poll()) gets each entry once, in order, and the words are free after it', () => {
    const dispatch = new CompletionDispatch(8)
    const seen: number[] = []
    dispatch.addOwner(1, owner((entry) => {
      seen.push(entry.wrId)
      if (entry.wrId === 2) {
        expect(dispatch.finishBatch()).toBe(3) // 3, 4, 5 delivered now, inside the handler of 2
        expect(dispatch.undelivered).toBe(0)
        // The words may now be polled into again: a second batch, delivered nested, after the first.
        dispatch.deliver(polled(dispatch, [[6, 1], [7, 1]]))
      }
    }))
    dispatch.deliver(polled(dispatch, [[1, 1], [2, 1], [3, 1], [4, 1], [5, 1]]))
    expect(seen).toEqual([1, 2, 3, 4, 5, 6, 7])
    expect(dispatch.dispatching).toBe(false)
  })

  it('a throwing delivery is contained: reported once as uncaught, the rest of the batch and other owners still delivered', async () => {
    process.on('uncaughtException', onUncaught)
    const dispatch = new CompletionDispatch(16)
    const a: number[] = []
    const b: number[] = []
    dispatch.addOwner(1, owner((entry) => {
      a.push(entry.wrId)
      if (entry.wrId === 9) throw new Error('handler failed at 9')
    }))
    dispatch.addOwner(2, owner((entry) => { b.push(entry.wrId) }))
    const batch: Array<[number, number]> = []
    for (let i = 1; i <= 16; i++) batch.push([i, i % 2 === 0 ? 2 : 1])
    dispatch.deliver(polled(dispatch, batch))
    expect(a).toEqual([1, 3, 5, 7, 9, 11, 13, 15])
    expect(b).toEqual([2, 4, 6, 8, 10, 12, 14, 16])
    await new Promise((resolve) => setImmediate(resolve))
    expect(uncaught.map((e) => (e as Error).message)).toEqual(['handler failed at 9'])
  })

  it('held reports are a FIFO: a handler that delivers them again (cq.poll()) continues the same queue, each report once', async () => {
    const dispatch = new CompletionDispatch(4)
    const reports: number[] = []
    const target = {
      handler: (tag: number) => {
        reports.push(tag)
        if (tag === 1) dispatch.deliverHeld() // what a cq.poll() from the handler does
        if (tag === 2) { dispatch.holding = true; dispatch.report(target, 4, undefined); dispatch.holding = false } // a post inside a handler holds its report
      },
    }
    dispatch.holding = true
    for (const tag of [1, 2, 3]) dispatch.report(target, tag, undefined)
    dispatch.holding = false
    expect(reports).toEqual([])
    dispatch.deliverHeld()
    await Promise.resolve()
    expect(reports).toEqual([1, 2, 3, 4])
    expect(dispatch.reportsHeld).toBe(false)
  })

  it('the words cannot be transferred away from the addon (structuredClone copies them)', () => {
    const dispatch = new CompletionDispatch(4)
    structuredClone(dispatch.words, { transfer: [dispatch.words.buffer as ArrayBuffer] }) // an ArrayBuffer: never shared memory
    expect(dispatch.words.byteLength).toBe((4 * COMPLETION_WORDS + 1) * 4)
  })
})
