// How long a fresh Node process takes to run our paths at full speed in the
// guest: from the start, rounds of N READs through the addon's bound post and
// poll ("raw"), the tagged READ and `await qp.read()`, with the C loop's READ
// (bench/icount/build/verbs-loop, built by `npm run bench -- icount`) after
// each round; µs per READ, and the time since the start. V8 optimizes on a
// background thread, and in the guest that takes seconds: a benchmark that
// starts a process per measurement and warms it up briefly times the interpreter.
//   bash scripts/softroce.sh run -- node scripts/diag/warmup-rounds.mjs [N] [ROUNDS]
import { execFileSync } from 'node:child_process'
import { openDevice } from '../../dist/index.js'
import { connectedPair, rawReadLoop, taggedReadLoop } from '../../bench/pair.mjs'
import { roceV2Ipv4GidIndex } from '../../bench/perftest.mjs'
const N = Number(process.argv[2] ?? 2000), ROUNDS = Number(process.argv[3] ?? 12)
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const raw = rawReadLoop(await connectedPair(device, 'busy'))
const tagged = taggedReadLoop(await connectedPair(device, 'busy'))
const { c, s } = await connectedPair(device, 'busy')
const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
const awaited = async (n) => { for (let i = 0; i < n; i++) await c.qp.read(local, remote) }
const gid = String(roceV2Ipv4GidIndex(device))
const cLoop = () => Number(execFileSync(new URL('../../bench/icount/build/verbs-loop', import.meta.url).pathname, [device.name, gid, String(N), 'read'], { encoding: 'utf8' }).trim().split(' ')[3])
const t00 = performance.now()
for (let r = 0; r < ROUNDS; r++) {
  const row = [`t=${((performance.now() - t00) / 1000).toFixed(1)}s`]
  for (const [name, f] of [['raw', raw], ['tagged', tagged], ['await', awaited]]) { const t = performance.now(); await f(N); row.push(`${name} ${((performance.now() - t) * 1000 / N).toFixed(1)}`) }
  row.push(`C ${cLoop().toFixed(1)}`); console.log(row.join('  '))
}
process.exit(0)
