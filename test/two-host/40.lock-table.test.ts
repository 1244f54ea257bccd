// The lock table across two machines: guest 0 runs the server of
// examples/lock-table.mjs (lock words, fencing counters, records), guest 1
// runs the 8 clients (in 2 processes) against it over the wire. Guest 0
// checks exactly that every counter equals the increments made under its lock.
import { describe, expect, it } from 'vitest'
import { expectExactServer, runLockTableExample } from '../lock-table-example.js'

const role = process.env.SOFTROCE_HOST_INDEX
const peer = process.env.SOFTROCE_PEER_ADDR
const PORT = 7483
const ROUNDS = Number(process.env.NODE_IBVERBS_LOCK_ROUNDS || 30)

describe(`lock table across two hosts (this is host ${role})`, () => {
  it(`8 clients on one host x ${ROUNDS} rounds on 4 locks of the other: every counter is exact`, async () => {
    expect(role === '0' || role === '1', 'SOFTROCE_HOST_INDEX').toBe(true)
    const common = ['--clients', '8', '--locks', '4', '--ops', String(ROUNDS), '--lease-ms', '5000', '--port', String(PORT)]
    if (role === '0') {
      const run = await runLockTableExample(['--role', 'server', ...common], 560_000)
      expectExactServer(run, 4, 8 * ROUNDS) // every counter exact, 8 x ROUNDS increments in all, OK, exit 0
    } else {
      const run = await runLockTableExample(['--role', 'clients', '--host', peer!, '--processes', '2', ...common], 560_000)
      expect(run.err).toBe('')
      expect(run.out).toMatch(/lock-table clients: 8 clients in 2 processes/)
      expect(run.code).toBe(0)
    }
  }, 600_000)
})
