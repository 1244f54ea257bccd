// examples/kv-cluster.mjs runs to its own verdict: a private etcd, 2 prefill
// and 2 decode agents in their own processes finding each other by name, one
// decode agent killed (SIGKILL) with requests in flight and restarted under
// the same name and port. Every request must be delivered once and every
// block verified by the decode agent that got it, and at least one must have
// been re-routed after the kill. No timing is asserted: the example's own
// bounds (--timeout-ms) and this test's are only there to end a hang.
import { describe, expect } from 'vitest'
import { execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { etcdBinary } from '../../scripts/etcd-server.mjs'
import { needs } from './needs.js'

const it = needs(etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)")
const example = fileURLToPath(new URL('../../examples/kv-cluster.mjs', import.meta.url))
const REQUESTS = 32
/**
 * The example's bound on each step (--timeout-ms). Under `npm run test:asan` five Node processes of
 * the sanitizer build and etcd share the guest: an agent took longer than 120 s to start there.
 */
const BOUND_MS = process.env.NODE_IBVERBS_SANITIZED === '1' ? 400_000 : 120_000

function run(args: readonly string[]): Promise<{ status: number | null; signal: string | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [example, ...args], { encoding: 'utf8', timeout: BOUND_MS + 80_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      const status = error ? (typeof error.code === 'number' ? error.code : null) : 0
      resolve({ status, signal: error?.signal ?? null, stdout, stderr })
    })
  })
}

/** The example's `summary key=value ...` line as numbers. */
function summary(stdout: string, stderr: string): Record<string, number> {
  const line = stdout.split('\n').find((l) => l.startsWith('summary '))
  if (!line) throw new Error(`no summary line in:\n${stdout.slice(-4000)}\nstderr:\n${stderr.slice(-4000)}`)
  return Object.fromEntries(line.slice('summary '.length).split(' ').map((pair) => pair.split('=')).map(([k, value]) => [k, Number(value)]))
}

describe('examples/kv-cluster.mjs', () => {
  it('delivers every request once and verified, re-routing those in flight to a decode agent killed and restarted mid-run', async () => {
    // On a starved guest (the sanitizer build beside other guests, 2026-12-07) etcd took more than 2 s
    // (the example's default bound) to grant a lease, and 5 s leases (its default TTL) of live decode
    // agents lapsed again and again: each lapse is a departure that re-routes, until requests gave up.
    // A lapse now needs 15 s without a keep-alive; the kill is seen at once (the link drops).
    const result = await run(['--requests', String(REQUESTS), '--ttl', '15', '--request-timeout-ms', '10000', '--timeout-ms', String(BOUND_MS)])
    const s = summary(result.stdout, result.stderr)
    const report = `exit ${result.status ?? result.signal}\n${result.stdout.slice(-6000)}\n${result.stderr.slice(-3000)}`
    // stale_reports (a confirmation of an attempt the router had given up on) is not a loss: not asserted.
    expect(s, report).toMatchObject({ requests: REQUESTS, delivered: REQUESTS, lost: 0, misdelivered: 0, bad_blocks: 0, killed: 1 })
    expect(s.in_flight_at_kill, report).toBeGreaterThanOrEqual(1)
    expect(s.rerouted, `at least one request re-routed after the kill\n${report}`).toBeGreaterThanOrEqual(1)
    expect(s.failed_attempts, report).toBeGreaterThanOrEqual(s.rerouted!)
    // Every failed attempt is named by a code on the 'failed attempts:' line.
    const codes = /^failed attempts: (.*)$/m.exec(result.stdout)?.[1] ?? ''
    expect(codes, report).toMatch(/^([A-Z_]+ \d+)(, [A-Z_]+ \d+)*$/)
    expect(codes.split(', ').reduce((n, part) => n + Number(part.split(' ')[1]), 0)).toBe(s.failed_attempts)
    // Bytes: the blocks' sum, each checked by a decode agent; the restart was under the same name and port.
    expect(s.bytes).toBe(s.blocks! * 16 * 1024)
    expect(result.stdout).toMatch(/restarting it as decode-1 on port (\d+)[\s\S]*decode-1 is back \(incarnation [0-9a-f]{8}, port \1\)/)
    expect(result.stdout).toMatch(/^ok: all 32 requests delivered once and every block verified/m)
    expect(result.status, report).toBe(0)
    console.log(`kv-cluster: ${/^summary .*$/m.exec(result.stdout)?.[0]}\n${/^checked: .*$/m.exec(result.stdout)?.[0]}\n${/^failed attempts: .*$/m.exec(result.stdout)?.[0]}`)
  }, BOUND_MS + 120_000)
})
