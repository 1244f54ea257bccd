// Completions arrive on the event loop without blocking it.
import { describe, expect, it } from 'vitest'
import { connectedPair, testDevice } from './helpers.js'

describe('event loop', () => {
  it.each(['event', 'busy'] as const)('timers keep firing while thousands of operations complete (%s polling)', async (pollMode) => {
    const device = testDevice()
    const { a, b, close } = await connectedPair(device, { pollMode })
    const total = 5000
    let completed = 0
    const seenDuring: number[] = []
    const timer = setInterval(() => { if (completed > 0 && completed < total) seenDuring.push(completed) }, 1)
    const remote = b.region.asRemote()
    await Promise.all(Array.from({ length: total }, (_, i) =>
      a.qp.write(a.region.slice((i % 256) * 64, 64), remote.slice((i % 256) * 64, 64)).then(() => { completed++ })))
    clearInterval(timer)
    expect(completed).toBe(total)
    // The timer ran between completions at least twice, at different points.
    expect(new Set(seenDuring).size).toBeGreaterThanOrEqual(2)
    close()
    device.close()
  })
})
