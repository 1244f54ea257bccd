// The fault campaign's control channel (test/two-host/faults/control.ts) on
// loopback: a step that failed on one side leaves messages the other side
// never read; the barrier before the next step drops them, so the two hosts
// meet again instead of failing every later step.
import { describe, expect, it } from 'vitest'
import { openControl, type Control } from '../two-host/faults/control.js'

async function pair(port: number): Promise<[Control, Control]> {
  const host0 = openControl('0', '127.0.0.1', '127.0.0.1', port, 10_000)
  const host1 = openControl('1', '127.0.0.1', '127.0.0.1', port, 10_000)
  return Promise.all([host0, host1])
}

describe('fault campaign control channel', () => {
  it('sync() drops what a failed step left behind and meets the peer at the same tag', async () => {
    const [a, b] = await pair(47311)
    try {
      b.send({ type: 'flapped', completed: [] }) // a never expects it: its step failed first
      b.send({ type: 'kill' })
      await Promise.all([a.sync('next step', 10_000), b.sync('next step', 10_000)])
      b.send({ type: 'ready' })
      expect(await a.expect('ready', 10_000)).toEqual({ type: 'ready' })
    } finally {
      a.close(); b.close()
    }
  })

  it('expect() of a side still in its step fails at once on the peer\'s barrier and leaves it for sync()', async () => {
    const [a, b] = await pair(47312)
    try {
      const bAtBarrier = b.sync('next step', 10_000)
      await expect(a.expect('flapped', 10_000)).rejects.toThrow(/expected 'flapped', got .*sync/)
      await Promise.all([a.sync('next step', 10_000), bAtBarrier])
    } finally {
      a.close(); b.close()
    }
  })
})
