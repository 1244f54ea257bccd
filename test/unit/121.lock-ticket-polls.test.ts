// When a FIFO waiter polls the serving word (lib/locks/ticket.ts, pure
// logic): it sleeps out the turns ahead of it, measured, instead of polling
// at a fixed rate; the one next in line polls near the end of the holder's
// turn. The atomics this saves are the CPU the holder needs on rxe.
import { describe, expect, it } from 'vitest'
import { HoldTime, pollDelay, type TicketTable } from '../../dist/locks/ticket.js'

function table(turnMs: number, maxBackoffMs = 16): TicketTable {
  const hold = new HoldTime()
  if (turnMs > 0) hold.observe(turnMs)
  return { qp: undefined as never, leaseMs: 2000, graceMs: 1000, maxBackoffMs, hold }
}

describe('FIFO polls', () => {
  it('average this client\'s holds', () => {
    const h = new HoldTime()
    expect(h.ms).toBe(0)
    h.observe(4)
    expect(h.ms).toBe(4)
    h.observe(14) // a running average: moves by 0.3 of the difference
    expect(h.ms).toBeCloseTo(7)
    h.observe(Number.NaN)
    h.observe(-1)
    expect(h.ms).toBeCloseTo(7)
  })

  it('before this client held the lock: next in line backs off as the spin lock, the others poll at the cap', () => {
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

})
