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
import { etcdBinary } from '../../scripts/etcd-server.mjs'
import { expectDelivered, runKvCluster } from '../engine/kv-cluster.js'
import { envMissing, needs } from '../rdma/needs.js'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peerAddr = process.env.SOFTROCE_PEER_ADDR
const it = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_ADDR', 'SOFTROCE_PEER_ADDR') ??
  (role !== '0' || etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)"))
const ROUTER_PORT = 7493
const REQUESTS = 32

describe(`examples/kv-cluster.mjs across two hosts (this is host ${role})`, () => {
  it('delivers every request once and verified from host 0\'s prefill agents to host 1\'s decode agents, one killed and restarted there mid-run', async () => {
    // The bounds of rdma/108 (a lease lapses after 15 s without a keep-alive; etcd requests may take 10 s in the emulated guests).
    const common = ['--ttl', '15', '--request-timeout-ms', '10000', '--timeout-ms', '120000']
    if (role === '0') {
      const result = await runKvCluster(['--listen', `${local}:${ROUTER_PORT}`, '--agents', 'prefill-0,prefill-1', '--requests', String(REQUESTS), ...common], 220_000)
      const { report } = expectDelivered(result, REQUESTS)
      // Where each agent is, as etcd has it: the decode agents publish host 1's address, the prefill agents this one's.
      const esc = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
      for (const name of ['decode-0', 'decode-1']) expect(result.stdout, report).toMatch(new RegExp(`${name} at ${esc(peerAddr!)}:\\d+`))
      for (const name of ['prefill-0', 'prefill-1']) expect(result.stdout, report).toMatch(new RegExp(`${name} at ${esc(local!)}:\\d+`))
      // The kill and the restart were host 1's launcher's, under the same name and port.
      expect(result.stdout, report).toMatch(new RegExp(`killing decode-1 \\(pid \\d+ on the launcher at ${esc(peerAddr!)},`))
      expect(result.stdout, report).toMatch(/decode-1 is dead \(SIGKILL\); restarting it as decode-1/)
      // Both decode agents confirmed requests; decode-1 under two incarnations.
      expect(result.stdout, report).toMatch(/^checked: decode-0 \d+ requests \(1 incarnation\), decode-1 \d+ requests \(2 incarnations\)$/m)
      expect(result.stderr, report).toBe('')
      console.log(`kv-cluster across hosts: ${/^summary .*$/m.exec(result.stdout)?.[0]}\n${/^checked: .*$/m.exec(result.stdout)?.[0]}\n${/^failed attempts: .*$/m.exec(result.stdout)?.[0]}`)
    } else {
      const result = await runKvCluster(['--role', 'launcher', '--router', `${peerAddr}:${ROUTER_PORT}`, '--agents', 'decode-0,decode-1', ...common], 220_000)
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
