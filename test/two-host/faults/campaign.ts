// The whole two-host fault campaign of issue 11 (`npm run test:faults`):
// scripts/faults.mjs bundles this file and both guests run it with plain
// node (a vitest start-up costs minutes in a loaded guest). Quick faults
// first: RC giving up, UD under loss, a link flap, kill -9 and restart; then
// every netem setting under every RC verb with a 64 MiB WRITE and READ, the
// transfer engine (random blocks, write with a notification, read) and
// ib_write_bw under the same netem; last the peer guest powered off. Each
// step prints one FAULT-FIGURE line with its checks and pass/fail.
import { parse, roceV2Ipv4GidIndex, run } from '../../../bench/perftest.mjs'
import { cmWhileDown, connectAfterNeighbourFlush, linkFlap, netemRound, peerDeath, retryExhausted, udLoss, type DeathResult } from './scenarios.js'
import { newDataConnection, openSession, peer, role, type Session } from './session.js'
import type { Round } from './verbs-round.js'
import { clearNetem, figure, leakView, netem, same } from './wire.js'
import { netemTransferRound, openTransfer, transferLinkFlap, transferTotalLoss } from './transfer-round.js'
import { transferPeerDeath } from './transfer-death.js'

const MiB = 1 << 20
const BIG = Number(process.env.FAULTS_BYTES || 64 * MiB)
const BOUND = Number(process.env.FAULTS_TIMEOUT_MS || 900_000)
// FAULTS_ONLY=netem runs only the netem rounds (and ib_write_bw), each on a
// fresh connection; FAULTS_ONLY=quick everything but them.
const ONLY_NETEM = process.env.FAULTS_ONLY === 'netem'
const ONLY_QUICK = process.env.FAULTS_ONLY === 'quick'
// FAULTS_NETEM_READ=0: the netem rounds WRITE (and SEND, atomics) but do not READ, for sizes where
// rxe's READ under loss takes hours ("RC READ under loss"); FAULTS_SETTINGS: only the settings
// whose names are listed (comma-separated, e.g. 'clean wire,loss 1%').
const NETEM_READ = process.env.FAULTS_NETEM_READ !== '0'
const ONLY_SETTINGS = process.env.FAULTS_SETTINGS?.split(',').map((name) => name.trim())
// The guest powers off once per boot, in the last step: FAULTS_POWEROFF=engine makes it happen under
// the transfer engine's writes instead of the verbs API's (the default, 'verbs').
const POWEROFF_ENGINE = process.env.FAULTS_POWEROFF === 'engine'
const big = (seed: number): Round => ({ bytes: BIG, sends: 64, sendSize: 4096, atomics: 64, seed, timeoutMs: BOUND })
const small = (seed: number): Round => ({ bytes: 2 * MiB, sends: 16, sendSize: 4096, atomics: 32, seed, timeoutMs: 120_000 })

const SETTINGS: Array<[string, string[]]> = [
  ['clean wire', ['delay', '0ms']],
  ['loss 1%', ['loss', '1%']],
  ['loss 5%', ['loss', '5%']],
  ['delay 10ms ± 5ms', ['delay', '10ms', '5ms']],
  // netem reorders by sending some packets at once while the rest wait the delay.
  ['reorder 5% (delay 5ms)', ['delay', '5ms', 'reorder', '5%']],
  ['duplicate 1%', ['duplicate', '1%']],
  ['loss 20%', ['loss', '20%']],
]

if (role !== '0' && role !== '1') throw new Error('run me through npm run test:faults (scripts/faults.mjs)')
let failed = 0

/** Runs one fault; `checks` lists what did not hold (empty: pass). */
async function step(fault: string, fn: () => Promise<{ data: object; failures: string[] }>): Promise<void> {
  // Both hosts start each step together, whatever the last one left behind.
  await s.control.sync(fault, BOUND + 600_000)
  const start = performance.now()
  try {
    const { data, failures } = await fn()
    if (failures.length) failed++
    figure({ fault, result: failures.length ? 'fail' : 'pass', failures, seconds: Math.round((performance.now() - start) / 100) / 10, ...data })
  } catch (error) {
    failed++
    figure({ fault, result: 'fail', error: (error as Error).stack ?? String(error), seconds: Math.round((performance.now() - start) / 100) / 10 })
  }
}


/** ib_write_bw, 64 KiB x (BIG / 64 KiB), host 1 -> host 0, with the same netem on both egresses. */
async function perftestUnder(s: Session, args: string[], port: number): Promise<unknown> {
  const device = process.env.SOFTROCE_DEVICE || 'rxe0'
  const toolArgs = ['-d', device, '-x', String(roceV2Ipv4GidIndex(device)), '-F', '-p', String(port), '-n', String(BIG / 65536), '-s', '65536', '-t', '128']
  netem(args)
  try {
    if (role === '0') {
      const server = run('ib_write_bw', toolArgs, BOUND)
      s.control.send({ type: 'perftest-up' })
      await server
      return (await s.control.expect('perftest-result', 900_000)).result
    }
    await s.control.expect('perftest-up')
    let client: Awaited<ReturnType<typeof run>> | undefined
    let seconds = 0
    for (let attempt = 0; attempt < 40; attempt++) {
      await new Promise((resolve) => setTimeout(resolve, 500))
      const start = performance.now()
      client = await run('ib_write_bw', [...toolArgs, peer], BOUND)
      seconds = (performance.now() - start) / 1000
      if (!/Couldn't connect|Unable to init the socket/.test(client!.out)) break
    }
    // perftest times itself with the CPU's cycle counter; in the loaded TCG guest it printed 0.00 MB/sec:
    // the wall clock of the whole client run (connection set-up included) is kept next to it.
    const wallMBps = Math.round((BIG / 1048576 / seconds) * 100) / 100
    const result = { ...(parse(client!.out) ?? { failed: `exit ${client!.code} signal ${client!.signal}: ${client!.out.slice(-700)}` }), wallMBps }
    s.control.send({ type: 'perftest-result', result })
    return result
  } finally {
    clearNetem()
  }
}

const s = await openSession(BIG)
// The transfer engine's agents (one link for the whole campaign), used by the netem rounds.
const t = await openTransfer(s.control, BIG)

if (!ONLY_NETEM) await quickFaults()
async function quickFaults(): Promise<void> {
for (const [retryCount, timeout] of [[3, 14], [1, 16], [0, 12]] as const) {
  await step(`100% loss, retryCount ${retryCount}, timeout ${timeout}`, async () => {
    const result = await retryExhausted(s, { retryCount, timeout, timeoutMs: 120_000 })
    return { data: result, failures: result.code === 'RETRY_EXC_ERR' ? [] : [`rejected with ${result.code ?? 'nothing (resolved)'}, expected RETRY_EXC_ERR`] }
  })
}
await step('100% loss, retryCount 7 (rxe: retries forever), timeoutMs 10000', async () => {
  const result = await retryExhausted(s, { retryCount: 7, timeout: 14, timeoutMs: 10_000 })
  // The transfer engine's QPs retry the same way: its write is bounded by its timeoutMs, and the next one works.
  const transfer = await transferTotalLoss(t, s.control, { timeoutMs: 10_000, round: { bytes: Math.min(BIG, 4 * MiB), seed: 700, timeoutMs: 120_000 } })
  const failures = result.code === 'ETIMEDOUT' ? [] : [`settled with ${result.code ?? 'success'}, expected ETIMEDOUT`]
  return { data: { ...result, transfer }, failures: [...failures, ...transfer.problems.map((p) => `transfer engine: ${p}`)] }
})

for (const loss of [5, 20]) {
  await step(`UD, loss ${loss}%`, async () => {
    const result = await udLoss(s, loss, 400)
    const failures: string[] = []
    if (result.received + result.lost !== 400) failures.push('received + lost is not what was sent')
    if ('corrupt' in result && result.corrupt) failures.push(`${result.corrupt} datagrams arrived damaged`)
    if ('notSettledAsLost' in result && result.notSettledAsLost) failures.push(`${result.notSettledAsLost} receives ended otherwise than as lost`)
    return { data: { ...result, lostSeqs: undefined }, failures }
  })
}

await step('link flap (down 3 s, mid-transfer)', async () => {
  // 1 MiB WRITEs into the second half of host 0's region (FAULTS_BYTES long): at most 16 of them.
  const result = await linkFlap(s, { chunks: Math.min(16, Math.floor(BIG / MiB)), downMs: 3000, timeoutMs: 120_000, round: small(300) })
  const failures: string[] = []
  if (result.wrong.length) failures.push(`WRITEs that resolved but left other bytes: ${result.wrong.join(', ')}`)
  failures.push(...result.after.problems.map((p) => `new connection: ${p}`))
  if ('events' in result && result.events) {
    const types = result.events.map((e) => e.type)
    if (!types.includes('PORT_ERR') || types.lastIndexOf('PORT_ACTIVE') < types.indexOf('PORT_ERR')) failures.push(`port events ${types.join(', ')}`)
  }
  // The same fault under the transfer engine: a second flap in the middle of a write of random blocks.
  const transfer = await transferLinkFlap(t, s.control, { downMs: 3000, round: { bytes: Math.min(BIG, 4 * MiB), seed: 600, timeoutMs: 120_000 } })
  failures.push(...transfer.problems.map((p) => `transfer engine: ${p}`))
  return { data: { ...result, transfer }, failures }
})

for (const [i, how] of (['close', 'disconnect', 'reject'] as const).entries()) {
  await step(`rdma_cm while the link is down (3 s): ${how}, then a reconnect`, async () => {
    const result = await cmWhileDown(s, { how, downMs: 3000, round: small(310 + i) })
    const failures = result.after.problems.map((p) => `new connection: ${p}`)
    if ('cmIds' in result && result.cmIds && result.cmIds.after !== result.cmIds.before) failures.push(`cm_ids ${result.cmIds.before} before, ${result.cmIds.after} after`)
    if ('rejectedWith' in result && result.rejectedWith === 'connected') failures.push('the request rejected while down got connected')
    if (result.stalls?.length) failures.push(`first reconnect attempts that timed out: ${result.stalls.join('; ')}`)
    return { data: result, failures }
  })
}

await step('connect after a neighbour flush, 30 times', async () => {
  const result = await connectAfterNeighbourFlush(s, 30)
  const failed = result.outcomes?.filter((o) => !o.startsWith('ok')) ?? []
  return { data: result, failures: failed.length ? [`connects that failed: ${failed.join(', ')}`] : [] }
})

await step('kill -9 of the peer mid-transfer, then restart on the same address and port', async () => {
  const result = await peerDeath(s, { how: 'kill', restart: true, timeoutMs: 60_000 })
  const failures: string[] = []
  if (role === '1') {
    if (!same((result as { peerAfterKill: object }).peerAfterKill, { qp: 0, cq: 0, pd: 0, mr: 0, cm_id: 0, fds: 0 })) failures.push('the kernel still holds objects of the killed process')
  } else {
    const death = result as DeathResult
    if (!same(leakView(death.after, death.before), death.before)) failures.push('counts after the dead connection closed differ from the baseline')
    const restart = death.restart && { ...death.restart, afterRestart: leakView(death.restart.afterRestart, death.before) }
    if (!same(restart, { generation: 2, untouched: true, verified: true, afterRestart: death.before })) failures.push('the restarted peer did not get a clean, verified connection with counts back to baseline')
  }
  return { data: result ?? {}, failures }
})

}

for (const [i, [name, args]] of ONLY_QUICK ? [] : SETTINGS.entries()) {
  if (ONLY_SETTINGS && !ONLY_SETTINGS.includes(name)) continue
  await step(name, async () => {
    // A fresh connection per setting: a request left behind by the previous one cannot hold this one up.
    const old = s.conn
    await newDataConnection(s)
    old.close()
    const result = await netemRound(s, args, { ...big(100 + i), read: NETEM_READ })
    const transfer = await netemTransferRound(t, s.control, args, { bytes: BIG, seed: 200 + i, timeoutMs: BOUND, read: NETEM_READ })
    const perftest = await perftestUnder(s, args, 19500 + i)
    return { data: { netem: args.join(' '), ...result, transfer, perftest }, failures: [...result.problems, ...transfer.problems.map((p) => `transfer engine: ${p}`)] }
  })
}

// The same under the transfer engine: host 1's agent process killed in the middle of host 0's writes, then restarted.
if (!ONLY_NETEM) await step('kill -9 of the peer agent mid-transfer, then restart (transfer engine)', async () => {
  const result = await transferPeerDeath(t, s.control, { timeoutMs: 60_000 })
  const failures = [...result.problems]
  if (role === '1' && !same(result.peerAfterKill, { qp: 0, cq: 0, pd: 0, mr: 0, cm_id: 0, fds: 0 })) failures.push('the kernel still holds objects of the killed agent')
  return { data: result, failures }
})

// Last: host 1's guest powers itself off in the middle of host 0's transfer.
if (!ONLY_NETEM && !POWEROFF_ENGINE) await step('peer guest powered off mid-transfer', async () => {
  const result = await peerDeath(s, { how: 'poweroff', restart: false, timeoutMs: 20_000 })
  if (role === '1') return { data: {}, failures: [] }
  const death = result as DeathResult
  return { data: death, failures: same(leakView(death.after, death.before), death.before) ? [] : ['counts after closing differ from the baseline'] }
})
if (!ONLY_NETEM && POWEROFF_ENGINE) await step('peer guest powered off mid-transfer (transfer engine)', async () => {
  const result = await transferPeerDeath(t, s.control, { how: 'poweroff', timeoutMs: 20_000 })
  return { data: result, failures: [...result.problems] }
})

t.close()
await s.close()
console.log(`fault campaign, host ${role}: ${failed} step(s) failed`)
process.exit(failed ? 1 : 0)
