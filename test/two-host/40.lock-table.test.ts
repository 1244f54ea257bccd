// The lock table across two machines: guest 0 runs the server of
// examples/lock-table.mjs (lock words, fencing counters, records), guest 1
// runs the 8 clients (in 2 processes) against it over the wire. Guest 0
// checks exactly that every counter equals the increments made under its lock.
import { describe, expect, it } from 'vitest'
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const role = process.env.SOFTROCE_HOST_INDEX
const peer = process.env.SOFTROCE_PEER_ADDR
const PORT = 7483
const ROUNDS = Number(process.env.NODE_IBVERBS_LOCK_ROUNDS || 30)
const example = fileURLToPath(new URL('../../examples/lock-table.mjs', import.meta.url))

function runExample(args: string[], timeoutMs: number): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [example, ...args, '--timeout-ms', String(timeoutMs - 5000)], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => { out += d })
    child.stderr.on('data', (d) => { err += d })
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, out, err }) })
  })
}

describe(`lock table across two hosts (this is host ${role})`, () => {
  it(`8 clients on one host x ${ROUNDS} rounds on 4 locks of the other: every counter is exact`, async () => {
    expect(role === '0' || role === '1', 'SOFTROCE_HOST_INDEX').toBe(true)
    const common = ['--clients', '8', '--locks', '4', '--ops', String(ROUNDS), '--lease-ms', '5000', '--port', String(PORT)]
    if (role === '0') {
      const run = await runExample(['--role', 'server', ...common], 560_000)
      expect(run.err).toBe('')
      const locks = [...run.out.matchAll(/^lock \d+: expected (\d+) increments, counted (\d+)/gm)].map((m) => ({ expected: Number(m[1]), counted: Number(m[2]) }))
      expect(locks).toHaveLength(4)
      for (const lock of locks) expect(lock.counted).toBe(lock.expected)
      expect(locks.reduce((sum, l) => sum + l.expected, 0)).toBe(8 * ROUNDS)
      expect(run.out).toMatch(/lock-table: OK/)
      expect(run.code).toBe(0)
    } else {
      const run = await runExample(['--role', 'clients', '--host', peer!, '--processes', '2', ...common], 560_000)
      expect(run.err).toBe('')
      expect(run.out).toMatch(/lock-table clients: 8 clients in 2 processes/)
      expect(run.code).toBe(0)
    }
  }, 600_000)
})
