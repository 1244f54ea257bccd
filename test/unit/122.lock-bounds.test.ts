// The bounds of lock calls (lib/locks/bounded.ts) against a QP stand-in
// whose atomics can hang: a call whose atomic never answers ends at its
// deadline or abort with the error that names the call (made only when it
// fires), and the table works on normally afterwards.
import { describe, expect, it } from 'vitest'
import { heldWord, RemoteLockTable, RemoteRegion } from '../../dist/index.js'
import type { QueuePair } from '../../dist/index.js'

/** One lock word in memory, CAS'd by the stand-in; `answers` says how many more CAS answer (then they hang). */
function table() {
  const state = { word: 0n, answers: Infinity }
  const qp = {
    compareAndSwap(_slot: unknown, expect: bigint, swap: bigint): Promise<bigint> {
      if (state.answers <= 0) return new Promise(() => {})
      state.answers--
      const before = state.word
      if (before === expect) state.word = swap
      return Promise.resolve(before)
    },
  }
  const locks = new RemoteLockTable(qp as unknown as QueuePair, { locks: new RemoteRegion(0x1000n, 1, 64).slice(0, 64), owner: 1 })
  return { state, locks }
}

describe('lock call bounds', () => {
  it('an acquire whose CAS never answers times out with what it saw: attempts and the last holder', async () => {
    const { state, locks } = table()
    state.answers = 0
    await expect(locks.acquire(2, { timeoutMs: 30 })).rejects.toMatchObject({
      code: 'ERR_LOCK_TIMEOUT', message: 'acquire of lock 2 timed out after 30 ms (1 attempts; last seen held by nobody)',
    })
    // Held by owner 7: a retry at once with the fresh word, a yield, then the third CAS hangs.
    state.word = heldWord(7, 5n)
    state.answers = 2
    await expect(locks.acquire(2, { timeoutMs: 200 })).rejects.toMatchObject({
      code: 'ERR_LOCK_TIMEOUT', message: 'acquire of lock 2 timed out after 200 ms (3 attempts; last seen held by owner 7)',
    })
  })

  it('an acquire aborted while its CAS is in flight rejects with ABORT_ERR and the reason as cause', async () => {
    const { state, locks } = table()
    state.answers = 0
    const controller = new AbortController()
    const acquiring = locks.acquire(1, { signal: controller.signal })
    const reason = new Error('enough')
    controller.abort(reason)
    await expect(acquiring).rejects.toMatchObject({ code: 'ABORT_ERR', message: 'acquire of lock 1 was aborted', cause: reason })
  })

  it('release, renew and fence time out (ETIMEDOUT) or abort (ABORT_ERR) naming the verb', async () => {
    const { state, locks } = table()
    const grant = await locks.acquire(0)
    state.answers = 0
    await expect(locks.release(grant, { timeoutMs: 20 })).rejects.toMatchObject({ code: 'ETIMEDOUT', message: 'release timed out after 20 ms', verb: 'release' })
    await expect(locks.renew(grant, { timeoutMs: 20 })).rejects.toMatchObject({ code: 'ETIMEDOUT', message: 'renew timed out after 20 ms', verb: 'renew' })
    await expect(locks.fence(3n, new RemoteRegion(0x2000n, 2, 8).slice(0, 8), { timeoutMs: 20 })).rejects
      .toMatchObject({ code: 'ETIMEDOUT', message: 'fence timed out after 20 ms', verb: 'fence' })
    const controller = new AbortController()
    const renewing = locks.renew(grant, { signal: controller.signal })
    controller.abort()
    await expect(renewing).rejects.toMatchObject({ code: 'ABORT_ERR', message: 'renew was aborted', verb: 'renew', cause: controller.signal.reason })
  })

  it('after calls that failed, the next ones are bounded afresh: they succeed, and time out at their own deadline', async () => {
    const { state, locks } = table()
    state.answers = 0
    await expect(locks.acquire(0, { timeoutMs: 10 })).rejects.toMatchObject({ code: 'ERR_LOCK_TIMEOUT' })
    state.answers = Infinity
    for (let i = 0; i < 3; i++) {
      const grant = await locks.acquire(0)
      expect(grant.attempts).toBe(1)
      await locks.release(grant)
    }
    state.answers = 0
    const started = performance.now()
    await expect(locks.acquire(0, { timeoutMs: 40 })).rejects.toMatchObject({ message: 'acquire of lock 0 timed out after 40 ms (1 attempts; last seen held by nobody)' })
    expect(performance.now() - started).toBeGreaterThanOrEqual(39)
  })
})
