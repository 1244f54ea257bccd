// What rdma/108 and two-host/62 share: running examples/kv-cluster.mjs to its
// own verdict, and reading its `summary key=value ...` line.
import { execFile } from 'node:child_process'
import { expect } from 'vitest'
import { fileURLToPath } from 'node:url'

const example = fileURLToPath(new URL('../../examples/kv-cluster.mjs', import.meta.url))

export interface ExampleRun { status: number | null; signal: string | null; stdout: string; stderr: string }

/** Runs the example with `args`, killed after `timeoutMs` (only there to end a hang). */
export function runKvCluster(args: readonly string[], timeoutMs: number): Promise<ExampleRun> {
  return new Promise((resolve) => {
    execFile(process.execPath, [example, ...args], { encoding: 'utf8', timeout: timeoutMs, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      const status = error ? (typeof error.code === 'number' ? error.code : null) : 0
      resolve({ status, signal: error?.signal ?? null, stdout, stderr })
    })
  })
}

/** The example's `summary key=value ...` line as numbers; throws with the output's tail when there is none. */
export function kvSummary(stdout: string, stderr: string): Record<string, number> {
  const line = stdout.split('\n').find((l) => l.startsWith('summary '))
  if (!line) throw new Error(`no summary line in:\n${stdout.slice(-4000)}\nstderr:\n${stderr.slice(-4000)}`)
  return Object.fromEntries(line.slice('summary '.length).split(' ').map((pair) => pair.split('=')).map(([k, value]) => [k, Number(value)]))
}

/**
 * The example's verdict, as every kv-cluster test asserts it: `requests` delivered once and every block
 * verified, one decode agent killed with requests in flight and at least one re-routed, every failed attempt
 * named by a code, the bytes the blocks' sum, exit 0. Returns the summary and a report for further checks.
 */
export function expectDelivered(result: ExampleRun, requests: number): { s: Record<string, number>; report: string } {
  const s = kvSummary(result.stdout, result.stderr)
  const report = `exit ${result.status ?? result.signal}\n${result.stdout.slice(-6000)}\nstderr:\n${result.stderr.slice(-3000)}`
  // stale_reports (a confirmation of an attempt the router had given up on) is not a loss: not asserted.
  expect(s, report).toMatchObject({ requests, delivered: requests, lost: 0, misdelivered: 0, bad_blocks: 0, killed: 1 })
  expect(s.in_flight_at_kill, report).toBeGreaterThanOrEqual(1)
  expect(s.rerouted, `at least one request re-routed after the kill\n${report}`).toBeGreaterThanOrEqual(1)
  expect(s.failed_attempts, report).toBeGreaterThanOrEqual(s.rerouted!)
  // Every failed attempt is named by a code on the 'failed attempts:' line.
  const codes = /^failed attempts: (.*)$/m.exec(result.stdout)?.[1] ?? ''
  expect(codes, report).toMatch(/^([A-Z_]+ \d+)(, [A-Z_]+ \d+)*$/)
  expect(codes.split(', ').reduce((n, part) => n + Number(part.split(' ')[1]), 0)).toBe(s.failed_attempts)
  // Bytes: the blocks' sum, each checked by a decode agent; the restart was under the same name and port.
  expect(s.bytes).toBe(s.blocks! * 16 * 1024)
  expect(result.stdout, report).toMatch(/restarting it as decode-1 on port (\d+)[\s\S]*decode-1 is back \(incarnation [0-9a-f]{8}, port \1\)/)
  expect(result.stdout, report).toMatch(new RegExp(`^ok: all ${requests} requests delivered once and every block verified`, 'm'))
  expect(result.status, report).toBe(0)
  return { s, report }
}
