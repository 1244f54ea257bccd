// The whole two-host fault campaign (`npm run test:faults`, through
// scripts/faults.mjs; not part of `npm test`). Every netem setting of issue 11
// under every RC verb with a 64 MiB WRITE and READ, ib_write_bw under the same
// setting, RC giving up, UD under loss, a link flap, kill -9 and restart, and
// last the peer guest powered off. The quick faults come first. Prints FAULT-FIGURE lines for docs/reliability.md.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
// @ts-expect-error plain ESM without types
import { parse, roceV2Ipv4GidIndex, run } from '../../bench/perftest.mjs'
import { envMissing, needs } from '../rdma/needs.js'
import { linkFlap, netemRound, peerDeath, retryExhausted, udLoss, type DeathResult } from './faults/scenarios.js'
import { openSession, peer, role, type Session } from './faults/session.js'
import type { Round } from './faults/verbs-round.js'
import { clearNetem, figure, netem } from './faults/wire.js'

const test = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_PEER_ADDR'))
const MiB = 1 << 20
const BIG = Number(process.env.FAULTS_BYTES || 64 * MiB)
const big = (seed: number): Round => ({ bytes: BIG, sends: 64, sendSize: 4096, atomics: 64, seed, timeoutMs: 900_000 })
const small = (seed: number): Round => ({ bytes: 2 * MiB, sends: 16, sendSize: 4096, atomics: 32, seed, timeoutMs: 60_000 })

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

/** ib_write_bw, 64 KiB x (BIG / 64 KiB), host 1 -> host 0, with the same netem on both egresses. */
async function perftestUnder(s: Session, args: string[], port: number) {
  const device = process.env.SOFTROCE_DEVICE || 'rxe0'
  const toolArgs = ['-d', device, '-x', String(roceV2Ipv4GidIndex(device)), '-F', '-p', String(port), '-n', String(BIG / 65536), '-s', '65536', '-t', '128']
  netem(args)
  try {
    if (role === '0') {
      const server = run('ib_write_bw', toolArgs, 900_000)
      s.control.send({ type: 'perftest-up' })
      await server
      return (await s.control.expect('perftest-result', 900_000)).result
    }
    await s.control.expect('perftest-up')
    let client: { out: string } | undefined
    for (let attempt = 0; attempt < 40; attempt++) {
      await new Promise((resolve) => setTimeout(resolve, 500))
      client = await run('ib_write_bw', [...toolArgs, peer], 900_000)
      if (!/Couldn't connect|Unable to init the socket/.test(client!.out)) break
    }
    const result = parse(client!.out) ?? { failed: client!.out.slice(-400) }
    s.control.send({ type: 'perftest-result', result })
    return result
  } finally {
    clearNetem()
  }
}

describe(`fault campaign across two hosts (this is host ${role})`, () => {
  let s: Session
  beforeAll(async () => { if (role) s = await openSession(BIG) }, 180_000)
  afterAll(async () => { await s?.close() })

  for (const [retryCount, timeout] of [[3, 14], [1, 16], [0, 12]]) {
    test(`100% loss, retryCount ${retryCount}, timeout ${timeout}: the WRITE rejects with RETRY_EXC_ERR`, async () => {
      const result = await retryExhausted(s, { retryCount, timeout, timeoutMs: 120_000 })
      figure({ fault: `100% loss, retryCount ${retryCount}, timeout ${timeout}`, ...result })
      expect(result.code).toBe('RETRY_EXC_ERR')
    })
  }

  test('100% loss with retryCount 7: rxe retries forever, the request\'s timeoutMs ends it (ETIMEDOUT)', async () => {
    const result = await retryExhausted(s, { retryCount: 7, timeout: 14, timeoutMs: 10_000 })
    figure({ fault: '100% loss, retryCount 7 (rxe: forever), timeoutMs 10000', ...result })
    expect(result.code).toBe('ETIMEDOUT')
  })

  for (const loss of [5, 20]) {
    test(`UD under ${loss}% loss: what arrived is intact, what did not is counted as lost`, async () => {
      const result = await udLoss(s, loss, 400)
      figure({ fault: `UD, loss ${loss}%`, ...result })
      expect(result.received + result.lost).toBe(400)
      if ('corrupt' in result) {
        expect(result.corrupt).toBe(0)
        expect(result.notSettledAsLost).toBe(0)
      }
    }, 900_000)
  }

  test('link flap mid-transfer', async () => {
    const result = await linkFlap(s, { chunks: 16, downMs: 3000, timeoutMs: 120_000, round: small(300) })
    figure({ fault: 'link flap (down 3 s)', ...result })
    expect(result.wrong).toEqual([])
    expect(result.after.problems).toEqual([])
    if ('events' in result && result.events) expect(result.events.map((e) => e.type)).toEqual(expect.arrayContaining(['PORT_ERR', 'PORT_ACTIVE']))
  }, 900_000)

  test('kill -9 of the peer mid-transfer, then restart on the same address and port', async () => {
    const result = await peerDeath(s, { how: 'kill', restart: true, timeoutMs: 60_000 })
    figure({ fault: 'kill -9 + restart', ...result })
    if (role === '0') {
      const death = result as DeathResult
      expect(death.after).toEqual(death.before)
      expect(death.restart).toEqual({ generation: 2, untouched: true, verified: true, afterRestart: death.before })
    }
  }, 900_000)

  SETTINGS.forEach(([name, args], i) => {
    test(`${name}: every RC verb delivers every byte exactly; ib_write_bw under the same netem`, async () => {
      const result = await netemRound(s, args, big(100 + i))
      const perftest = await perftestUnder(s, args, 19500 + i)
      figure({ fault: name, netem: args.join(' '), ...result, perftest })
      expect(result.problems).toEqual([])
    }, 1_900_000)
  })

  // Last: host 1's guest is gone afterwards (host 1 reports nothing more).
  test('power-off of the peer guest mid-transfer: every promise settles within its bound, counts back to baseline', async () => {
    const result = await peerDeath(s, { how: 'poweroff', restart: false, timeoutMs: 20_000 })
    if (role === '0') {
      const death = result as DeathResult
      figure({ fault: 'peer guest powered off', ...death })
      expect(death.after).toEqual(death.before)
    }
  }, 900_000)
})
