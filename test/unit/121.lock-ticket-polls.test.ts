// When a FIFO waiter polls the serving word (lib/locks/ticket.ts, pure
// logic): it sleeps out the turns ahead of it, measured, instead of polling
// at a fixed rate; the one next in line polls near the end of the holder's
// turn. The atomics this saves are the CPU the holder needs on rxe.
import { describe, expect, it } from 'vitest'
import { HandoverTime, pollDelay, type TicketTable } from '../../dist/locks/ticket.js'

function table(turnMs: number, maxBackoffMs = 16): TicketTable {
  const handover = new HandoverTime()
  if (turnMs > 0) handover.observe(turnMs, 1)
  return { qp: undefined as never, leaseMs: 2000, graceMs: 1000, maxBackoffMs, handover }
}

describe('FIFO polls', () => {
  it('average the turns seen: each sample is the time over the turns that went by', () => {
    const h = new HandoverTime()
    expect(h.ms).toBe(0)
    h.observe(12, 3) // 4 ms a turn
    expect(h.ms).toBe(4)
    h.observe(14, 1) // a running average: moves by 0.3 of the difference
    expect(h.ms).toBeCloseTo(7)
    h.observe(5, 0) // no turn went by: not a sample
    h.observe(Number.NaN, 1)
    expect(h.ms).toBeCloseTo(7)
  })

  it('before any turn was measured: next in line backs off as the spin lock, the others poll at the cap', () => {
    const t = table(0)
    expect(pollDelay(t, 1, 0, 0)).toBe(0)
    expect(pollDelay(t, 3, 0, 0)).toBe(16)
  })

  it('sleep three quarters of what should remain of the turns ahead, never more than 8 x maxBackoffMs', () => {
    const t = table(8)
    expect(pollDelay(t, 1, 2, 0)).toBeCloseTo(4.5) // 0.75 x the rest of the holder's turn
    expect(pollDelay(t, 3, 2, 0)).toBeCloseTo(16.5) // and of two more turns
    expect(pollDelay(t, 40, 0, 0)).toBe(128) // the cap: 8 x 16 ms
    expect(pollDelay({ ...table(300), leaseMs: 200 }, 3, 0, 0)).toBe(50) // or a quarter of the lease
  })

  it('near or past the estimated end: next in line every eighth of a turn (or the spin\'s backoff), the others every quarter', () => {
    const t = table(40)
    expect(pollDelay(t, 1, 38, 0)).toBe(5) // backoffMs(0) is 0: an eighth of the turn is longer than 0.75 x 2
    const late = pollDelay(t, 1, 45, 7) // backoffMs(7): [8, 16]
    expect(late).toBeGreaterThanOrEqual(8)
    expect(late).toBeLessThanOrEqual(16)
    expect(pollDelay(t, 2, 100, 0)).toBe(10)
  })

  it('an estimate that is too long shrinks: the waiter next in line polls before it ends', () => {
    // Turns of 10 ms, the estimate at 40: where the waiter first polls, and what it then measures.
    const h = new HandoverTime()
    h.observe(40, 1)
    const t = { ...table(0), handover: h }
    for (let i = 0; i < 20; i++) {
      let at = 0
      while (at < 10) at += pollDelay(t, 1, at, 0) // the turn ends at 10 ms: the first poll at or after it sees it
      h.observe(at, 1)
    }
    expect(h.ms).toBeLessThan(16)
  })
})
