// SlotWait: a request waiting for queue slots and CQ credits is bounded by
// its timeout and signal, leaves the queue it waits in, and gives back what
// it took.
import { afterEach, describe, expect, it, vi } from 'vitest'
import { SlotWait, WorkQueueSlots } from '../../lib/ops/slots.js'
import type { WaitOptions } from '../../lib/core/validate.js'

function waiter(queues: WorkQueueSlots[], slots: number, wait: WaitOptions, taken = 0, owner: unknown = 'qp') {
  const ready = vi.fn()
  const reject = vi.fn()
  new SlotWait(queues, taken, slots, owner, wait, 'send', 7, ready, reject).start()
  return { ready, reject }
}

describe('SlotWait', () => {
  afterEach(() => { vi.useRealTimers() })

  it('takes from each queue in turn and passes on what is left of the deadline', () => {
    vi.useFakeTimers()
    const queue = new WorkQueueSlots(2)
    const credits = new WorkQueueSlots(2)
    queue.used = 2
    const { ready } = waiter([queue, credits], 1, { timeoutMs: 1000 })
    vi.advanceTimersByTime(300)
    expect(ready).not.toHaveBeenCalled()
    queue.release(1)
    expect(ready).toHaveBeenCalledTimes(1)
    expect(ready.mock.calls[0]![0].timeoutMs).toBeLessThanOrEqual(700)
    expect([queue.used, credits.used]).toEqual([2, 1])
  })

  it('times out with ETIMEDOUT, leaves the queue and gives back what it took', () => {
    vi.useFakeTimers()
    const queue = new WorkQueueSlots(4)
    const credits = new WorkQueueSlots(1)
    credits.used = 1
    const first = waiter([queue, credits], 2, { timeoutMs: 50 })
    const second = waiter([queue, credits], 1, {})
    expect(queue.used).toBe(3) // both hold their queue slots while they wait for credit
    vi.advanceTimersByTime(50)
    expect(first.reject.mock.calls[0]![0]).toMatchObject({ code: 'ETIMEDOUT', verb: 'send', qpn: 7 })
    expect(queue.used).toBe(1)
    credits.release(1)
    expect(second.ready).toHaveBeenCalledTimes(1) // no longer behind the one that left
    expect(first.ready).not.toHaveBeenCalled()
  })

  it('an abort removes it from the queue and lets the next one in', () => {
    const queue = new WorkQueueSlots(2)
    queue.used = 1
    const controller = new AbortController()
    const big = waiter([queue], 2, { signal: controller.signal })
    const small = waiter([queue], 1, {})
    expect(small.ready).not.toHaveBeenCalled() // in order: behind the big one
    controller.abort('stop')
    expect(big.reject.mock.calls[0]![0]).toMatchObject({ code: 'ABORT_ERR', cause: 'stop' })
    expect(small.ready).toHaveBeenCalledTimes(1)
    expect(queue.used).toBe(2)
  })

  it('fail(error, owner) rejects only that owner\'s waiters and releases their earlier slots', () => {
    const queue = new WorkQueueSlots(4)
    const credits = new WorkQueueSlots(1)
    credits.used = 1
    const mine = waiter([queue, credits], 1, {}, 0, 'a')
    const theirs = waiter([queue, credits], 1, {}, 0, 'b')
    credits.fail(new Error('a failed'), 'a')
    expect(mine.reject).toHaveBeenCalledTimes(1)
    expect(theirs.reject).not.toHaveBeenCalled()
    expect(queue.used).toBe(1)
    credits.release(1)
    expect(theirs.ready).toHaveBeenCalledTimes(1)
  })
})
