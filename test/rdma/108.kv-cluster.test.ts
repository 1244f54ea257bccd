// examples/kv-cluster.mjs runs to its own verdict: a private etcd, 2 prefill
// and 2 decode agents in their own processes finding each other by name, one
// decode agent killed (SIGKILL) with requests in flight and restarted under
// the same name and port. Every request must be delivered once and every
// block verified by the decode agent that got it, and at least one must have
// been re-routed after the kill. No timing is asserted: the example's own
// bounds (--timeout-ms) and this test's are only there to end a hang.
import { describe, expect } from 'vitest'
import { etcdBinary } from '../../scripts/etcd-server.mjs'
import { expectDelivered, runKvCluster } from '../engine/kv-cluster.js'
import { needs } from './needs.js'

const it = needs(etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)")
const REQUESTS = 32
/**
 * The example's bound on each step (--timeout-ms). Under `npm run test:asan` five Node processes of
 * the sanitizer build and etcd share the guest: an agent took longer than 120 s to start there.
 */
const BOUND_MS = process.env.NODE_IBVERBS_SANITIZED === '1' ? 400_000 : 120_000

describe('examples/kv-cluster.mjs', () => {
  it('delivers every request once and verified, re-routing those in flight to a decode agent killed and restarted mid-run', async () => {
    // On a starved guest (the sanitizer build beside other guests, 2026-12-07) etcd took more than 2 s
    // (the example's default bound) to grant a lease, and 5 s leases (its default TTL) of live decode
    // agents lapsed again and again: each lapse is a departure that re-routes, until requests gave up.
    // A lapse now needs 15 s without a keep-alive; the kill is seen at once (the link drops).
    const result = await runKvCluster(['--requests', String(REQUESTS), '--ttl', '15', '--request-timeout-ms', '10000', '--timeout-ms', String(BOUND_MS)], BOUND_MS + 80_000)
    expectDelivered(result, REQUESTS)
    console.log(`kv-cluster: ${/^summary .*$/m.exec(result.stdout)?.[0]}\n${/^checked: .*$/m.exec(result.stdout)?.[0]}\n${/^failed attempts: .*$/m.exec(result.stdout)?.[0]}`)
  }, BOUND_MS + 120_000)
})
