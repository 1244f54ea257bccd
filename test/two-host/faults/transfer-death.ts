// Peer death under the transfer engine, across the two hosts: host 1 runs an
// agent in its own process (transfer-peer.mjs), host 0's agent keeps writes
// of random blocks going to it, and host 1 kills that process with SIGKILL.
// Every write must settle, coded, within its bound; once host 0 closes the
// peer, its kernel objects and fds are back to the baseline. Then the peer
// comes back on the same address and port: a fresh peer moves verified
// blocks, and its segment holds nothing of the dead connection's. With
// `how: 'poweroff'`, host 1's guest powers off instead (no restart): nothing
// tells host 0, so every write must settle by its timeoutMs.
import { fileURLToPath } from 'node:url'
import { pattern, scatter } from '../../rdma/helpers.js'
import type { Control } from './control.js'
import { powerOffGuest, startPeer } from './scenarios.js'
import { role } from './session.js'
import type { TransferSession } from './transfer-round.js'
import { counts, leakView, same, track, type Counts, type Settled } from './wire.js'

const PORT = 7491
const script = fileURLToPath(new URL('./transfer-peer.mjs', import.meta.url))
const MiB = 1 << 20
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export interface TransferDeathResult {
  before?: Counts; after?: Counts; writes?: number; completed?: number; codes?: Record<string, number>; maxSettleMs?: number
  peerAfterKill?: Counts
  restart?: { verified: boolean; untouched: boolean; afterClose: Counts }
  problems: string[]
}

export async function transferPeerDeath(t: TransferSession, control: Control, options: { timeoutMs: number; how?: 'kill' | 'poweroff' }): Promise<TransferDeathResult> {
  const how = options.how ?? 'kill'
  if (role === '1') {
    const first = await startPeer(1, script, PORT)
    control.send({ type: 'tpeer-up' })
    await control.expect(how === 'kill' ? 'tkill' : 'tpoweroff', options.timeoutMs + 120_000)
    if (how === 'poweroff') return powerOffGuest()
    await first.kill('SIGKILL')
    const peerAfterKill = counts(first.pid)
    control.send({ type: 'tkilled', peerAfterKill })
    const second = await startPeer(2, script, PORT)
    control.send({ type: 'tpeer-up' })
    await control.expect('trestart-done', options.timeoutMs + 120_000)
    await second.stop()
    return { peerAfterKill, problems: [] }
  }
  const problems: string[] = []
  if (t.segment.length < 4 * MiB) throw new Error(`transferPeerDeath needs a local segment of 4 MiB (FAULTS_BYTES >= 2 MiB), not ${t.segment.length}`)
  const host = process.env.SOFTROCE_PEER_ADDR!
  await control.expect('tpeer-up', 180_000)
  const before = counts()
  const peer = await t.agent.connect({ host, port: PORT, timeoutMs: 30_000 })
  // Two lanes of 1 MiB writes (random blocks) into the peer's 'kv', until one fails.
  const view = t.segment.bytes
  view.set(pattern(2 * MiB, 77), 0)
  const writes: Array<Promise<Settled>> = []
  let failed = false
  const lane = async (n: number) => {
    const blocks = scatter(MiB, 80 + n, 16).map((p) => ({ local: [t.segment, n * MiB + p.src] as [typeof t.segment, number], remote: ['kv', n * MiB + p.dst] as [string, number], length: p.length }))
    while (!failed) {
      const settled = track(t.agent.write(peer, blocks, { timeoutMs: options.timeoutMs }))
      writes.push(settled)
      if (!(await settled).ok) failed = true
    }
  }
  const lanes = [lane(0), lane(1)]
  await sleep(1000)
  control.send({ type: how === 'kill' ? 'tkill' : 'tpoweroff' })
  const peerAfterKill = how === 'kill' ? (await control.expect('tkilled', 120_000)).peerAfterKill as Counts : undefined
  await Promise.all(lanes)
  const settled = await Promise.all(writes)
  const codes: Record<string, number> = {}
  for (const r of settled) if (!r.ok) codes[r.code!] = (codes[r.code!] ?? 0) + 1
  const late = settled.filter((r) => r.ms > options.timeoutMs + 5000).length
  if (late) problems.push(`${late} writes settled more than 5 s after their timeoutMs (${options.timeoutMs} ms)`)
  const uncoded = Object.keys(codes).filter((code) => !/^[A-Z][A-Z0-9_]*$/.test(code))
  if (uncoded.length) problems.push(`writes rejected without a code: ${uncoded.join('; ')}`)
  t.agent.closePeer(peer)
  const after = counts()
  if (!same(leakView(after, before), before)) problems.push(`counts after closing the dead peer: ${JSON.stringify(after)} against ${JSON.stringify(before)}`)
  const figures = { before, after, writes: settled.length, completed: settled.filter((r) => r.ok).length, codes, maxSettleMs: Math.max(...settled.map((r) => r.ms)) }
  if (how === 'poweroff') return { ...figures, problems }
  // The peer comes back on the same address and port.
  await control.expect('tpeer-up', 180_000)
  const fresh = await t.agent.connect({ host, port: PORT, timeoutMs: 30_000 })
  const blocks = scatter(MiB, 90, 16)
  view.set(pattern(MiB, 91), 0)
  view.fill(0, 2 * MiB, 4 * MiB)
  await t.agent.write(fresh, blocks.map((p) => ({ local: [t.segment, p.src], remote: ['kv', p.dst], length: p.length })), { timeoutMs: 60_000 })
  // Read back what was written (into 2..3 MiB) and the next MiB of the fresh segment, which nobody wrote (3..4 MiB).
  await t.agent.read(fresh, [{ local: [t.segment, 2 * MiB], remote: ['kv', 0], length: 2 * MiB }], { timeoutMs: 60_000 })
  const expected = new Uint8Array(MiB)
  const source = pattern(MiB, 91)
  for (const p of blocks) expected.set(source.subarray(p.src, p.src + p.length), p.dst)
  const verified = Buffer.compare(view.subarray(2 * MiB, 3 * MiB), expected) === 0
  const untouched = view.subarray(3 * MiB, 4 * MiB).every((byte) => byte === 0)
  if (!verified) problems.push('the fresh peer did not hold the blocks written to it')
  if (!untouched) problems.push("the fresh peer's segment holds bytes nobody wrote to it")
  t.agent.closePeer(fresh)
  control.send({ type: 'trestart-done' })
  const afterClose = counts()
  if (!same(leakView(afterClose, before), before)) problems.push(`counts after closing the restarted peer: ${JSON.stringify(afterClose)}`)
  return { ...figures, peerAfterKill, restart: { verified, untouched, afterClose }, problems }
}
