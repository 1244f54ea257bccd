// examples/kv-cluster.mjs across two hosts, as its header tells a user to run
// it: host 0 runs the router (with a private etcd on its address) and the two
// prefill agents; host 1 runs a launcher that owns the two decode agents and
// starts, kills and restarts them on the router's word (a TCP/JSON-lines
// connection to the router). Every write crosses the wire: a prefill agent on
// host 0 connects by name to a decode agent on host 1. decode-1 is killed
// (SIGKILL, on host 1) with requests in flight and restarted under the same
// name and port. As in rdma/108: every request delivered once and every block
// verified, at least one re-routed; no timing is asserted.
import { describe, expect } from 'vitest'
import { execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { etcdBinary } from '../../scripts/etcd-server.mjs'
import { envMissing, needs } from '../rdma/needs.js'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peerAddr = process.env.SOFTROCE_PEER_ADDR
const it = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_ADDR', 'SOFTROCE_PEER_ADDR') ??
  (role !== '0' || etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)"))
const example = fileURLToPath(new URL('../../examples/kv-cluster.mjs', import.meta.url))
const ROUTER_PORT = 7493
const REQUESTS = 32

function run(args: readonly string[]): Promise<{ status: number | null; signal: string | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [example, ...args], { encoding: 'utf8', timeout: 220_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
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

describe(`examples/kv-cluster.mjs across two hosts (this is host ${role})`, () => {
  it('delivers every request once and verified from host 0\'s prefill agents to host 1\'s decode agents, one killed and restarted there mid-run', async () => {
    // The bounds of rdma/108 (a lease lapses after 15 s without a keep-alive; etcd requests may take 10 s in the emulated guests).
    const common = ['--ttl', '15', '--request-timeout-ms', '10000', '--timeout-ms', '120000']
    if (role === '0') {
      const result = await run(['--listen', `${local}:${ROUTER_PORT}`, '--agents', 'prefill-0,prefill-1', '--requests', String(REQUESTS), ...common])
      const s = summary(result.stdout, result.stderr)
      const report = `exit ${result.status ?? result.signal}\n${result.stdout.slice(-6000)}\nstderr:\n${result.stderr.slice(-3000)}`
      expect(s, report).toMatchObject({ requests: REQUESTS, delivered: REQUESTS, lost: 0, misdelivered: 0, bad_blocks: 0, killed: 1 })
      expect(s.in_flight_at_kill, report).toBeGreaterThanOrEqual(1)
      expect(s.rerouted, `at least one request re-routed after the kill\n${report}`).toBeGreaterThanOrEqual(1)
      expect(s.failed_attempts, report).toBeGreaterThanOrEqual(s.rerouted!)
      const codes = /^failed attempts: (.*)$/m.exec(result.stdout)?.[1] ?? ''
      expect(codes, report).toMatch(/^([A-Z_]+ \d+)(, [A-Z_]+ \d+)*$/)
      expect(codes.split(', ').reduce((n, part) => n + Number(part.split(' ')[1]), 0)).toBe(s.failed_attempts)
      expect(s.bytes).toBe(s.blocks! * 16 * 1024)
      // Where each agent is, as etcd has it: the decode agents publish host 1's address, the prefill agents this one's.
      const esc = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
      for (const name of ['decode-0', 'decode-1']) expect(result.stdout, report).toMatch(new RegExp(`${name} at ${esc(peerAddr!)}:\\d+`))
      for (const name of ['prefill-0', 'prefill-1']) expect(result.stdout, report).toMatch(new RegExp(`${name} at ${esc(local!)}:\\d+`))
      // The kill and the restart were host 1's launcher's, under the same name and port.
      expect(result.stdout, report).toMatch(new RegExp(`killing decode-1 \\(pid \\d+ on the launcher at ${esc(peerAddr!)},`))
      expect(result.stdout, report).toMatch(/decode-1 is dead \(SIGKILL\); restarting it as decode-1 on port (\d+)[\s\S]*decode-1 is back \(incarnation [0-9a-f]{8}, port \1\)/)
      // Both decode agents confirmed requests; decode-1 under two incarnations.
      expect(result.stdout, report).toMatch(/^checked: decode-0 \d+ requests \(1 incarnation\), decode-1 \d+ requests \(2 incarnations\)$/m)
      expect(result.stdout).toMatch(/^ok: all 32 requests delivered once and every block verified/m)
      expect(result.stderr, report).toBe('')
      expect(result.status, report).toBe(0)
      console.log(`kv-cluster across hosts: ${/^summary .*$/m.exec(result.stdout)?.[0]}\n${/^checked: .*$/m.exec(result.stdout)?.[0]}\n${/^failed attempts: .*$/m.exec(result.stdout)?.[0]}`)
    } else {
      const result = await run(['--role', 'launcher', '--router', `${peerAddr}:${ROUTER_PORT}`, '--agents', 'decode-0,decode-1', ...common])
      const report = `exit ${result.status ?? result.signal}\n${result.stdout.slice(-6000)}\nstderr:\n${result.stderr.slice(-3000)}`
      expect(result.stdout, report).toMatch(/launcher: killing decode-1 \(SIGKILL\), as the router asks/)
      expect(result.stdout.match(/launcher: started decode-1$/gm)?.length, `decode-1 started twice here\n${report}`).toBe(2)
      expect(result.stdout.match(/launcher: started decode-0$/gm)?.length, report).toBe(1)
      expect(result.stdout, report).toMatch(/^the router's verdict: ok: all 32 requests delivered once and every block verified/m)
      expect(result.stderr, report).toBe('')
      expect(result.status, report).toBe(0)
    }
  }, 240_000)
})
