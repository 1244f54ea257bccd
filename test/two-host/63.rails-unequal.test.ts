// Two rails of unequal speed: rail 1's wire on host 1 gets 40 ms of netem
// delay (no loss, a queue that does not drop), so with rxe's cap on unacked
// packets per QP it carries a fraction of rail 0's rate. Host 1 writes 16 MiB
// into host 0 round after round, each with a notification; host 0 checks every
// byte of each round. The first write shares the bytes equally (no rail
// measured yet); from then on the shares follow the rates the link measured,
// so the slow rail gets far less than half, and still some (it keeps being
// measured). The per-round times are printed: the equal first round against
// the measured ones is the cost of equal scheduling over unequal NICs.
import { execFileSync } from 'node:child_process'
import { describe, expect } from 'vitest'
import { TransferAgent, type Notification, type Peer } from '../../dist/index.js'
import { envMissing, needs } from '../rdma/needs.js'
import { pattern, within } from '../rdma/helpers.js'

const role = process.env.SOFTROCE_HOST_INDEX
const test = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_RAIL1_DEVICE', 'SOFTROCE_RAIL1_NETDEV'))
const PORT = 7486
const SIZE = 16 << 20
const ROUNDS = 6
const DELAY = '40ms'
const devices = [process.env.SOFTROCE_DEVICE!, process.env.SOFTROCE_RAIL1_DEVICE!]

function roundBytes(r: number): Buffer {
  return Buffer.alloc(SIZE).fill(pattern(4093, 8000 + r))
}

async function connectRetrying(agent: TransferAgent): Promise<Peer> {
  for (let attempt = 0; ; attempt++) { // the far side may still be starting
    try {
      return await agent.connect({ host: process.env.SOFTROCE_PEER_ADDR!, port: PORT, timeoutMs: 10_000 })
    } catch (error) {
      if (attempt > 120) throw error
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
}

describe(`two rails of unequal speed (this is host ${role})`, () => {
  test('slices follow the measured rates: the slow rail gets far less than half after the first write, every byte checked', async () => {
    if (role === '0') {
      const agent = await TransferAgent.create({ host: process.env.SOFTROCE_ADDR!, port: PORT, name: 'unequal-reader', devices, ackTimeout: 18 })
      try {
        const kv = agent.register('kv', { size: SIZE, remote: 'read-write' })
        for (let r = 0; r < ROUNDS; r++) {
          const notification = await within(new Promise<Notification>((resolve) => agent.once('notification', resolve)), 300_000, `round ${r}'s notification`)
          expect(notification.message).toBe(`round ${r}`)
          const wrong = Buffer.compare(kv.bytes, roundBytes(r)) !== 0
          await agent.notify(notification.peer, `wrong ${Number(wrong)}`, { timeoutMs: 30_000 })
          expect(wrong, `round ${r}'s bytes`).toBe(false)
        }
        await within(new Promise((resolve) => agent.once('peerLost', resolve)), 60_000, 'the writer to disconnect')
      } finally {
        await agent.close()
      }
      return
    }
    const netdev = process.env.SOFTROCE_RAIL1_NETDEV!
    const agent = await TransferAgent.create({ host: process.env.SOFTROCE_ADDR!, port: 0, name: 'unequal-writer', devices, qpsPerPeer: 2, ackTimeout: 18, stallTimeoutMs: 120_000 })
    execFileSync('tc', ['qdisc', 'replace', 'dev', netdev, 'root', 'netem', 'delay', DELAY, 'limit', '100000'], { stdio: 'pipe', timeout: 30_000 })
    try {
      const src = agent.register('src', { size: SIZE })
      const peer = await connectRetrying(agent)
      await within((async () => { while (!peer.segments.has('kv')) await new Promise((r) => setTimeout(r, 20)) })(), 30_000, 'the kv segment')
      const rounds: Array<{ ms: number; rail0: number; rail1: number }> = []
      for (let r = 0; r < ROUNDS; r++) {
        src.bytes.set(roundBytes(r))
        const before = agent.stats().rails
        const answer = new Promise<Notification>((resolve) => agent.once('notification', resolve))
        const result = await agent.write(peer, [{ local: [src, 0], remote: ['kv', 0], length: SIZE }], { notify: `round ${r}`, timeoutMs: 240_000 })
        expect(result.bytes).toBe(SIZE)
        expect((await within(answer, 120_000, `host 0's verdict on round ${r}`)).message).toBe('wrong 0')
        const after = agent.stats().rails
        rounds.push({ ms: Math.round(result.ms), rail0: after[0]!.bytes - before[0]!.bytes, rail1: after[1]!.bytes - before[1]!.bytes })
      }
      const share = rounds.map((r) => r.rail1 / (r.rail0 + r.rail1))
      // Figures, never asserted (emulated, shared guests): each round's time and rail 1's share of its bytes.
      console.log(`unequal rails (rail 1 +${DELAY}): ${rounds.map((r, i) => `round ${i}: ${r.ms} ms, rail 1 ${(100 * share[i]!).toFixed(1)}%`).join('; ')}`)
      console.log(`rails: ${JSON.stringify(agent.stats().rails)}`)
      for (const r of rounds) expect(r.rail0 + r.rail1, 'every byte confirmed once, on one rail or the other').toBe(SIZE)
      expect(share[0], 'the first write shares equally: no rail measured yet').toBeGreaterThan(0.35)
      expect(share[0]).toBeLessThan(0.65)
      for (let i = 2; i < ROUNDS; i++) {
        expect(share[i], `round ${i}: the slow rail's share follows its measured rate`).toBeLessThan(0.3)
        expect(share[i], `round ${i}: the slow rail still carries bytes (it keeps being measured)`).toBeGreaterThan(0)
      }
      expect(agent.stats().rails.every((r) => r.failovers === 0), 'a slow rail is not a failed one').toBe(true)
    } finally {
      try { execFileSync('tc', ['qdisc', 'del', 'dev', netdev, 'root'], { stdio: 'pipe', timeout: 30_000 }) } catch { /* nothing to remove */ }
      await agent.close()
    }
  })
})
