// Runs examples/lock-table.mjs for the lock-table suites (test/rdma/120 on one
// device, test/two-host/40 across two guests), reads its per-lock report and
// checks the server's verdict.
import { expect } from 'vitest'
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const example = fileURLToPath(new URL('../examples/lock-table.mjs', import.meta.url))

export interface ExampleRun { code: number | null; signal: string | null; out: string; err: string }

/** Runs the example to its end (killed after timeoutMs; it is told to give up 5 s before): exit code, signal, stdout, stderr. */
export function runLockTableExample(args: string[], timeoutMs: number): Promise<ExampleRun> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [example, ...args, '--timeout-ms', String(timeoutMs - 5000)], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => { out += d })
    child.stderr.on('data', (d) => { err += d })
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
    child.on('close', (code, signal) => { clearTimeout(timer); resolve({ code, signal, out, err }) })
  })
}

/** The server's per-lock lines: increments the clients made under each lock, and the counter found. */
export function exactness(out: string): Array<{ expected: number; counted: number }> {
  return [...out.matchAll(/^lock \d+: expected (\d+) increments, counted (\d+)/gm)].map((m) => ({ expected: Number(m[1]), counted: Number(m[2]) }))
}

/** The server's summary line: increments expected and counted in all, and acquisitions that found their lock held. */
export function summary(out: string): { expected: number; counted: number; contended: number } {
  const m = /^exactness: expected (\d+) increments, counted (\d+) .*contended acquisitions (\d+)/m.exec(out)
  expect(m, 'the server\'s exactness line').not.toBeNull()
  return { expected: Number(m![1]), counted: Number(m![2]), contended: Number(m![3]) }
}

/**
 * The server's verdict on an exclusion run: nothing on stderr, one line for
 * each of `locks` locks with its counter equal to the increments made under
 * it, `increments` in all, "lock-table: OK" and exit code 0. Steals are
 * allowed (a client starved for longer than its lease loses the lock, by
 * design); exactness is what must hold.
 */
export function expectExactServer(run: ExampleRun, locks: number, increments: number): void {
  expect(run.err).toBe('')
  const lines = exactness(run.out)
  expect(lines).toHaveLength(locks)
  for (const lock of lines) expect(lock.counted).toBe(lock.expected)
  expect(lines.reduce((sum, l) => sum + l.expected, 0)).toBe(increments)
  // The clients start together (the server's "go"): some acquisitions must have found their lock
  // held, or the run never tested exclusion.
  expect(summary(run.out).contended, 'acquisitions that found their lock held').toBeGreaterThan(0)
  expect(run.out).toMatch(/lock-table: OK/)
  expect(run.code).toBe(0)
}
