// RemoteLockTable in FIFO mode (lib/locks/ticket.ts): a ticket lock on real
// atomics over rxe. Grants come in arrival order, a waiter that gives up
// passes its turn on, a silent holder is moved on after its lease, and many
// clients on one lock share it evenly (the spin lock lets one client take it
// again and again: the fairness test fails with mode 'spin').
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { RemoteLockTable, type Device, type LockGrant, type LockMode } from '../../dist/index.js'
import { connectedPair, testDevice, u64 } from './helpers.js'

describe('RemoteLockTable, mode fifo (tickets)', () => {
  let device: Device
  beforeAll(() => { device = testDevice() })
  afterAll(() => device?.close())

  // Layout in b's region: 2 lock words (now serving) at 0, 2 ticket counters at 16, a shared counter at 64.
  async function table() {
    const pair = await connectedPair(device, { size: 4096 })
    const remote = pair.b.region.asRemote()
    const make = (owner: number, leaseMs = 60_000, mode: LockMode = 'fifo') =>
      new RemoteLockTable(pair.a.qp, { locks: remote.slice(0, 16), tokens: remote.slice(16, 16), owner, leaseMs, graceMs: 0, mode })
    return { pair, remote, make }
  }

  /** Resolves once the lock's ticket counter has reached `n` (so the waiters before have queued). */
  async function ticketsTaken(region: Parameters<typeof u64>[0], lock: number, n: bigint): Promise<void> {
    for (let i = 0; u64(region, 16 + lock * 8) < n; i++) {
      if (i > 2000) throw new Error(`the ticket counter stayed below ${n}`)
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
  }

  it('one round trip when free: the ticket is the token, release moves the serving word to the next ticket', async () => {
    const { pair, make } = await table()
    try {
      const locks = make(1)
      expect(locks.mode).toBe('fifo')
      const grant = await locks.acquire(1)
      expect(grant.token).toBe(1n) // ticket 0
      expect(u64(pair.b.region, 24)).toBe(1n) // the next ticket
      expect(u64(pair.b.region, 8)).toBe(grant.word)
      await locks.release(grant)
      expect(u64(pair.b.region, 8)).toBe(1n << 16n) // serving ticket 1
      const again = await locks.acquire(1)
      expect(again.token).toBe(2n)
      const renewed = await locks.renew(again)
      expect(renewed.word).not.toBe(again.word)
      expect(renewed.token).toBe(again.token)
      await expect(locks.release(again)).rejects.toMatchObject({ code: 'ERR_LOCK_LOST' })
      await locks.release(renewed)
      expect(u64(pair.b.region, 8)).toBe(2n << 16n)
      expect(() => make(2, 1000, 'queue' as never)).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    } finally {
      pair.close()
    }
  })

  it('grants in arrival order', async () => {
    const { pair, make } = await table()
    try {
      const holder = await make(1).acquire(0)
      const order: number[] = []
      const waiters: Promise<void>[] = []
      for (const owner of [2, 3, 4, 5]) {
        const locks = make(owner)
        waiters.push(locks.acquire(0, { timeoutMs: 30_000 }).then(async (grant) => { order.push(owner); await locks.release(grant) }))
        await ticketsTaken(pair.b.region, 0, BigInt(owner)) // queued before the next one comes
      }
      await make(1).release(holder)
      await Promise.all(waiters)
      expect(order).toEqual([2, 3, 4, 5])
    } finally {
      pair.close()
    }
  })

  it('a waiter that gives up passes its turn on: the one behind it does not wait a lease', async () => {
    const { pair, make } = await table()
    try {
      const holder = await make(1).acquire(0)
      // Leases of a minute: without the forfeit, the last waiter could only get the lock by waiting one out.
      await expect(make(2).acquire(0, { timeoutMs: 200 })).rejects.toMatchObject({ code: 'ERR_LOCK_TIMEOUT' })
      const controller = new AbortController()
      const aborting = make(3).acquire(0, { signal: controller.signal })
      await ticketsTaken(pair.b.region, 0, 3n)
      controller.abort()
      await expect(aborting).rejects.toMatchObject({ code: 'ABORT_ERR' })
      const last = make(4).acquire(0, { timeoutMs: 20_000 })
      await ticketsTaken(pair.b.region, 0, 4n)
      await make(1).release(holder)
      const grant = await last
      expect(grant.token).toBe(4n) // ticket 3: tickets 1 and 2 were passed on
      expect(grant.stolenFrom).toBeUndefined()
      await make(4).release(grant)
    } finally {
      pair.close()
    }
  })

  it('a holder that goes silent is moved on after its lease; its release and renew are refused', async () => {
    const { pair, make } = await table()
    try {
      const silent = make(1, 300)
      const grant = await silent.acquire(0)
      const waiter = make(2, 300)
      const next = await waiter.acquire(0, { timeoutMs: 20_000 })
      expect(next.stolenFrom).toBe(grant.word)
      expect(next.token).toBeGreaterThan(grant.token)
      await expect(silent.release(grant)).rejects.toMatchObject({ code: 'ERR_LOCK_LOST' })
      await expect(silent.renew(grant)).rejects.toMatchObject({ code: 'ERR_LOCK_LEASE_EXPIRED' })
      expect(u64(pair.b.region, 0)).toBe(next.word)
      await waiter.release(next)
    } finally {
      pair.close()
    }
  })

  /**
   * Eight clients on one lock, each taking it ROUNDS times and adding one to
   * a shared counter under it (a READ and a WRITE): when the first client is
   * done, how many rounds has the one with the fewest made?
   */
  async function contend(mode: LockMode): Promise<{ fewest: number; counter: bigint }> {
    const { pair, make } = await table()
    const ROUNDS = 40
    const CLIENTS = 8
    try {
      const done = Array<number>(CLIENTS).fill(0)
      let fewestAtFirstFinish = -1
      const local = pair.a.region
      const counter = pair.b.region.asRemote().slice(64, 8)
      const client = async (index: number) => {
        const locks = make(index + 1, 60_000, mode)
        const mine = local.slice(64 + index * 8, 8)
        for (let round = 0; round < ROUNDS; round++) {
          const grant: LockGrant = await locks.acquire(0, { timeoutMs: 120_000 })
          await pair.a.qp.read(mine, counter)
          new DataView(local.bytes.buffer, local.bytes.byteOffset + 64 + index * 8).setBigUint64(0, u64(local, 64 + index * 8) + 1n, true)
          await pair.a.qp.write(mine, counter)
          await locks.release(grant)
          done[index]++
        }
        if (fewestAtFirstFinish < 0) fewestAtFirstFinish = Math.min(...done)
      }
      await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i)))
      return { fewest: fewestAtFirstFinish, counter: u64(pair.b.region, 64) }
    } finally {
      pair.close()
    }
  }

  it('eight clients on one lock: exclusion holds, and none falls behind (each has most of its rounds when the first finishes)', async () => {
    const { fewest, counter } = await contend('fifo')
    expect(counter).toBe(8n * 40n)
    // Round robin: every client is within a round or two of the first. The spin lock leaves some near 0.
    expect(fewest).toBeGreaterThanOrEqual(30)
  }, 300_000)

  it('waiters sleep out the turns ahead of them: a few polls per acquisition, not one every maxBackoffMs', async () => {
    const { pair, remote } = await table()
    try {
      // The clients' QP, counting the serving-word polls (FETCH_ADD 0) they post.
      let polls = 0
      const qp = pair.a.qp
      const counting = {
        compareAndSwap: qp.compareAndSwap.bind(qp),
        fetchAndAdd: (slice: Parameters<typeof qp.fetchAndAdd>[0], add: bigint) => {
          if (add === 0n) polls++
          return qp.fetchAndAdd(slice, add)
        },
      } as unknown as typeof qp
      const CLIENTS = 3
      const ROUNDS = 5
      const HOLD_MS = 80
      const client = async (owner: number) => {
        const locks = new RemoteLockTable(counting, { locks: remote.slice(0, 16), tokens: remote.slice(16, 16), owner, leaseMs: 60_000, mode: 'fifo' })
        for (let round = 0; round < ROUNDS; round++) {
          const grant = await locks.acquire(0, { timeoutMs: 120_000 })
          await new Promise((resolve) => setTimeout(resolve, HOLD_MS))
          await locks.release(grant)
        }
      }
      await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i + 1)))
      const perAcquisition = polls / (CLIENTS * ROUNDS)
      // Each acquisition waits about two turns of >= 80 ms. Polling every maxBackoffMs (16 ms) with the
      // spin's backoff when next in line, as the FIFO mode did before it measured turns, made ~15 each.
      expect(perAcquisition).toBeLessThan(8)
    } finally {
      pair.close()
    }
  }, 120_000)
})
