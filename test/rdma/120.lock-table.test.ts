// A lock table on one-sided atomics (lib/locks, examples/lock-table.mjs):
// exclusion checked exactly (every protected counter equals the increments
// made under its lock), a holder killed with SIGKILL whose lock is stolen
// after its lease and whose fencing token is refused when replayed, and the
// client's coded errors, all against the real device.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { RemoteLockTable, decodeWord, type Device, type QueuePair, type RemoteSlice } from '../../dist/index.js'
import { heldWord, releasedWord } from '../../dist/locks/lock-word.js'
import { connectedPair, setU64, testDevice, u64 } from './helpers.js'
import { exactness, expectExactServer, runLockTableExample, summary } from '../lock-table-example.js'

// The campaign: 8 client processes x 500 rounds (3.6 min in the guest on a busy host, 2026-12-01).
// NODE_IBVERBS_LOCK_ROUNDS=N runs fewer or more rounds.
const ROUNDS = Number(process.env.NODE_IBVERBS_LOCK_ROUNDS || 500)

describe('lock table (examples/lock-table.mjs: server and client processes over rdma_cm)', () => {
  it(`exclusion: 8 client processes x ${ROUNDS} rounds on 4 locks, every counter equals the increments made under its lock`, async () => {
    // 8 clients, each its own process, connection and owner id.
    const run = await runLockTableExample(['--clients', '8', '--processes', '8', '--locks', '4', '--ops', String(ROUNDS), '--lease-ms', '5000'], 1_200_000)
    expectExactServer(run, 4, 8 * ROUNDS) // every counter exact, 8 x ROUNDS increments in all, OK, exit 0
  }, 1_220_000)

  it('negative control: the same rounds without the locks lose updates, and the server\'s check says so', async () => {
    // Without this, nothing shows that the exactness check above can fail on this setup. 8 clients in one
    // process start together on 1 lock: their READ-add-WRITE rounds interleave and overwrite each other.
    const run = await runLockTableExample(['--unlocked', '--clients', '8', '--processes', '1', '--locks', '1', '--ops', '40'], 400_000)
    expect(run.err).toBe('')
    const { expected, counted } = summary(run.out)
    expect(expected).toBe(8 * 40)
    expect(counted).toBeLessThan(expected)
    expect(run.out).toMatch(/updates lost/)
    expect(run.out).toMatch(/lock-table: FAILED/)
    expect(run.code).toBe(1)
  }, 420_000)

  it('holder dies: a SIGKILLed holder\'s lock is stolen after its lease, its replayed token and release are refused', async () => {
    const run = await runLockTableExample(['--kill-holder', '--clients', '2', '--processes', '1', '--locks', '2', '--ops', '10', '--lease-ms', '1500'], 400_000)
    expect(run.err).toBe('')
    expect(run.out).toMatch(/holder \(client 3\) killed with SIGKILL while holding lock 0/)
    expect(run.out).toMatch(/dead holder's word was stolen; replayed fence: ERR_LOCK_FENCED; replayed release: ERR_LOCK_LOST/)
    for (const lock of exactness(run.out)) expect(lock.counted).toBe(lock.expected)
    expect(run.out).toMatch(/lock-table: OK/)
    expect(run.code).toBe(0)
  }, 420_000)
})

describe('RemoteLockTable', () => {
  let device: Device
  beforeAll(() => { device = testDevice() })
  afterAll(() => device?.close())

  // Layout in b's region: 2 lock words at 0, 2 counters at 16, a fence word at 32.
  async function table(connect?: Record<string, number>) {
    const pair = await connectedPair(device, { size: 4096, connect })
    const remote = pair.b.region.asRemote()
    const make = (owner: number, leaseMs = 60_000) => new RemoteLockTable(pair.a.qp, { locks: remote.slice(0, 16), tokens: remote.slice(16, 16), owner, leaseMs, graceMs: 0 })
    return { pair, remote, make }
  }

  it('acquire writes owner|sequence, the sequence is the token, release leaves the sequence for the next holder', async () => {
    const { pair, make } = await table()
    try {
      const locks = make(7)
      const grant = await locks.acquire(1)
      expect(u64(pair.b.region, 8)).toBe(grant.word)
      expect(decodeWord(grant.word)).toEqual({ owner: 7, sequence: 1n })
      expect(grant.token).toBe(1n)
      expect(u64(pair.b.region, 24)).toBe(0n) // spin mode does not touch the counters
      await locks.release(grant)
      expect(u64(pair.b.region, 8)).toBe(1n) // free (no owner), sequence 1
      // Another client, which never saw the lock: its first CAS expects a fresh word and finds sequence 1, the next one takes it.
      const other = await make(8).acquire(1)
      expect(other).toMatchObject({ token: 2n, attempts: 2, stolenFrom: undefined })
      await make(8).release(other)
      const again = await locks.acquire(1)
      expect(again).toMatchObject({ token: 3n, attempts: 2 }) // it expected the word of its own release: 2 tries
      // Refused options change nothing: no CAS is posted (the lock stays held).
      await expect(locks.release(again, { timeoutMs: null as never })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      await expect(locks.renew(again, { timeoutMs: -1 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
      await expect(locks.fence(again.token, pair.b.region.asRemote().slice(32, 8), { signal: 'no' as never })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' })
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(u64(pair.b.region, 8)).toBe(again.word)
      expect(u64(pair.b.region, 32)).toBe(0n)
      await locks.release(again)
      expect(u64(pair.b.region, 8)).toBe(3n)
      const fourth = await locks.acquire(1)
      expect(fourth).toMatchObject({ token: 4n, attempts: 1 }) // the word its release left: one CAS
      await locks.release(fourth)
    } finally {
      pair.close()
    }
  })

  it('an uncontended acquire is one atomic: the token comes with the CAS', async () => {
    // Nobody answers (the peer QP is gone, and retries are 4.3 s apart): whatever acquire posts stays in flight.
    const { pair, make } = await table({ timeout: 20 })
    try {
      pair.b.qp.close()
      const acquiring = make(9).acquire(0, { timeoutMs: 600_000 })
      acquiring.catch(() => {})
      await new Promise((resolve) => setImmediate(resolve)) // whatever acquire's turn gathered is posted
      // The client before 2026-12-07 posted a FETCH_ADD for the token behind the CAS: 2 here.
      expect(pair.a.qp.outstanding).toBe(1)
      pair.a.qp.close()
      await expect(acquiring).rejects.toMatchObject({ code: 'ERR_CLOSED' })
    } finally {
      pair.close()
    }
  })

  it('spin mode needs no counters; FIFO mode refuses a table without them (coded)', async () => {
    const { pair, remote } = await table()
    try {
      const locks = new RemoteLockTable(pair.a.qp, { locks: remote.slice(0, 16), owner: 3 })
      const grant = await locks.acquire(0)
      expect(grant.token).toBe(1n)
      await locks.release(grant)
      expect(() => new RemoteLockTable(pair.a.qp, { locks: remote.slice(0, 16), owner: 3, mode: 'fifo' })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    } finally {
      pair.close()
    }
  })

  it('a held lock: a second client gives up with ERR_LOCK_TIMEOUT (bounded), then steals after the lease', async () => {
    const { pair, make } = await table()
    try {
      const holder = make(1, 300)
      const grant = await holder.acquire(0)
      // A waiter with a long lease cannot steal within its 100 ms: it must give up, coded.
      await expect(make(2, 60_000).acquire(0, { timeoutMs: 100 })).rejects.toMatchObject({ code: 'ERR_LOCK_TIMEOUT' })
      const waiter = make(2, 300)
      const stolen = await waiter.acquire(0, { timeoutMs: 20_000 })
      expect(stolen.stolenFrom).toBe(grant.word)
      expect(stolen.token).toBeGreaterThan(grant.token)
      // The old holder finds out: its release and renew are refused, the lock word is untouched.
      await expect(holder.release(grant)).rejects.toMatchObject({ code: 'ERR_LOCK_LOST' })
      expect(u64(pair.b.region, 0)).toBe(stolen.word)
      expect(() => holder.checkLease(grant)).toThrow(expect.objectContaining({ code: 'ERR_LOCK_LEASE_EXPIRED' }))
      await waiter.release(stolen)
    } finally {
      pair.close()
    }
  })

  it('a waiter whose word went stale while it slept tries the current one at once (a busy holder does not starve it)', async () => {
    // The busy holder is this test, writing the lock word in b's memory just before each of the waiter's
    // CAS runs (every CAS is real): if the waiter slept since its last CAS, the holder has released and
    // taken the lock again (sequence + 1, held); if it retries at once, the holder has only released.
    // The client before a68adc1 kept expecting the word of its last look after each sleep (this fails with it).
    const { pair, remote } = await table()
    try {
      let sequence = 5n
      let slept = true
      const holderWrites = (): void => {
        if (slept) setU64(pair.b.region, 0, heldWord(9, ++sequence))
        else setU64(pair.b.region, 0, releasedWord(heldWord(9, sequence)))
        slept = false
      }
      const qp = pair.a.qp
      const waiterQp = {
        compareAndSwap: (slot: RemoteSlice, compare: bigint, swap: bigint) => {
          holderWrites()
          const done = qp.compareAndSwap(slot, compare, swap)
          // A sleep goes through setImmediate or a timer, so this runs first; a retry at once is posted before it.
          void done.then(() => setImmediate(() => { slept = true }), () => {})
          return done
        },
      } as unknown as QueuePair
      const waiter = new RemoteLockTable(waiterQp, { locks: remote.slice(0, 16), owner: 2, leaseMs: 60_000 })
      const grant = await waiter.acquire(0, { timeoutMs: 2_000 })
      expect(grant).toMatchObject({ attempts: 2, token: 7n }) // found held at 6, retried at once on free 6
      expect(u64(pair.b.region, 0)).toBe(grant.word)
    } finally {
      pair.close()
    }
  })

  it('fence: a token installs over smaller ones, a smaller token is refused with ERR_LOCK_FENCED by the CAS', async () => {
    const { pair, remote, make } = await table()
    try {
      const locks = make(3)
      const fence = remote.slice(32, 8)
      await locks.fence(5n, fence)
      expect(u64(pair.b.region, 32)).toBe(5n)
      await locks.fence(5n, fence) // the same holder again: fine
      await locks.fence(9n, fence)
      await expect(locks.fence(6n, fence)).rejects.toMatchObject({ code: 'ERR_LOCK_FENCED' })
      expect(u64(pair.b.region, 32)).toBe(9n)
    } finally {
      pair.close()
    }
  })

  it('renew changes the word (restarting waiters\' count) and keeps the token; abort and bad arguments are coded', async () => {
    const { pair, remote, make } = await table()
    try {
      const locks = make(4)
      const grant = await locks.acquire(0)
      const renewed = await locks.renew(grant)
      expect(renewed.word).not.toBe(grant.word)
      expect(renewed.token).toBe(grant.token)
      expect(u64(pair.b.region, 0)).toBe(renewed.word)
      await expect(locks.release(grant)).rejects.toMatchObject({ code: 'ERR_LOCK_LOST' })
      const controller = new AbortController()
      controller.abort()
      await expect(make(5).acquire(0, { signal: controller.signal })).rejects.toMatchObject({ code: 'ABORT_ERR' })
      await locks.release(renewed)
      setU64(pair.b.region, 0, 0n)
      expect(() => make(0)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
      expect(() => new RemoteLockTable(pair.a.qp, { locks: remote.slice(4, 8), tokens: remote.slice(16, 8), owner: 1 })).toThrow(/aligned/)
      expect(() => locks.lockWord(2)).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    } finally {
      pair.close()
    }
  })
})
