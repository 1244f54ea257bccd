// Two-rail agents found by name. Host 0 runs a real etcd (Debian's
// etcd-server, started here) on its rail-1 address, so that both guests reach
// it whatever happens to rail 0's wire. Each guest's agent owns [rxe0, rxe1]
// and publishes one address per rail, in rail order: each side checks the
// other's record. Then host 1 takes rail 0's wire down on its side and
// connects to host 0 by name: rail 0's address does not answer from here,
// rail 1's does (the link's control channel runs on rail 1), and a notified
// write moves every byte over rail 1 (rail 0's data QPs fail and their
// slices go to rail 1); host 0 checks every byte.
import { execFileSync } from 'node:child_process'
import { describe, expect } from 'vitest'
import { TransferAgent, type Notification, type PeerLeftEvent, type PeerRecord } from '../../dist/index.js'
import { envMissing, needs } from '../rdma/needs.js'
import { pattern, within } from '../rdma/helpers.js'
import { etcdBinary, startEtcd, type EtcdServer } from '../../scripts/etcd-server.mjs'

const role = process.env.SOFTROCE_HOST_INDEX
const test = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_NETDEV', 'SOFTROCE_RAIL1_DEVICE', 'SOFTROCE_RAIL1_ADDR', 'SOFTROCE_RAIL1_PEER_ADDR') ??
  (etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)"))
const AGENT_PORT = 7486
const ETCD_CLIENT_PORT = 7491
const ETCD_PEER_PORT = 7492
/** The data QPs' ACK timeout, as test 60 has it (the emulated guests answer late). */
const ACK_TIMEOUT = 18
const SIZE = 16 << 20
const devices = [process.env.SOFTROCE_DEVICE!, process.env.SOFTROCE_RAIL1_DEVICE!]
/** etcd in an emulated guest busy with rxe can take seconds to answer: a generous request bound. */
const metadata = (host: string) => ({ endpoints: [`http://${host}:${ETCD_CLIENT_PORT}`], ttlSeconds: 20, requestTimeoutMs: 10_000, prefix: '/rails-by-name/' })

/** TransferAgent.create(), again while etcd does not answer yet (host 0's may still be starting) or is slow. */
async function createRetrying(options: Parameters<typeof TransferAgent.create>[0]): Promise<TransferAgent> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await TransferAgent.create(options)
    } catch (error) {
      if ((error as { code?: string }).code !== 'ERR_METADATA_UNAVAILABLE' || attempt > 60) throw error
      await new Promise((resolve) => setTimeout(resolve, 1000))
    }
  }
}

/** Resolves with the record of `name` once the agent's view has it. */
async function recordOf(agent: TransferAgent, name: string): Promise<PeerRecord> {
  return within((async () => {
    for (;;) {
      const record = agent.members().get(name)
      if (record) return record
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  })(), 180_000, `the record of '${name}'`)
}

describe(`two-rail agents found by name (this is host ${role})`, () => {
  test('each publishes one address per rail; with rail 0\'s wire down, a peer connects by name over rail 1 and writes every byte', async () => {
    if (role === '0') {
      const etcd: EtcdServer = await startEtcd({ host: process.env.SOFTROCE_RAIL1_ADDR!, clientPort: ETCD_CLIENT_PORT, peerPort: ETCD_PEER_PORT })
      try {
        const agent = await createRetrying({ host: process.env.SOFTROCE_ADDR!, port: AGENT_PORT, name: 'rails-target', devices, ackTimeout: ACK_TIMEOUT,
          metadata: metadata(process.env.SOFTROCE_RAIL1_ADDR!) })
        try {
          const kv = agent.register('kv', { size: SIZE, remote: 'read-write' })
          const left = new Promise<PeerLeftEvent>((resolve) => agent.on('peerLeft', (event) => { if (event.record.name === 'rails-writer') resolve(event) }))
          const notified = new Promise<Notification>((resolve) => agent.once('notification', resolve))
          const writer = await recordOf(agent, 'rails-writer')
          console.log(`the writer's record: ${JSON.stringify(writer.addresses)}`)
          expect(writer.addresses.map((a) => a.device), 'one address per rail, in rail order').toEqual(devices)
          expect(writer.addresses.map((a) => a.host)).toEqual([process.env.SOFTROCE_PEER_ADDR, process.env.SOFTROCE_RAIL1_PEER_ADDR])
          const notification = await within(Promise.race([notified, left.then(() => { throw new Error('the writer left before its notification') })]), 300_000, 'the writer\'s notification')
          expect(notification.message).toBe('by name over rail 1')
          const wrong = Buffer.compare(kv.bytes, Buffer.alloc(SIZE).fill(pattern(4093, 7101))) !== 0
          await agent.notify(notification.peer, `wrong ${Number(wrong)}`, { timeoutMs: 30_000 })
          expect(wrong, 'the bytes written by name over rail 1').toBe(false)
          await within(left, 120_000, 'the writer to leave')
        } finally {
          await agent.close()
        }
      } finally {
        await etcd.stop()
      }
    } else {
      const netdev = process.env.SOFTROCE_NETDEV!
      const agent = await createRetrying({ host: process.env.SOFTROCE_ADDR!, port: 0, name: 'rails-writer', devices, qpsPerPeer: 2, ackTimeout: ACK_TIMEOUT,
        stallTimeoutMs: 120_000, metadata: metadata(process.env.SOFTROCE_RAIL1_PEER_ADDR!) })
      let down = false
      try {
        const src = agent.register('src', { size: SIZE })
        src.bytes.set(Buffer.alloc(SIZE).fill(pattern(4093, 7101)))
        const target = await recordOf(agent, 'rails-target')
        // Rail 0's wire down on this side: host 0's rail-0 address no longer answers from here.
        execFileSync('ip', ['link', 'set', netdev, 'down'], { stdio: 'pipe', timeout: 30_000 })
        down = true
        const started = performance.now()
        const peer = await agent.connect('rails-target', { timeoutMs: 60_000 })
        console.log(`connected by name with rail 0 down in ${(performance.now() - started).toFixed(0)} ms`)
        await within((async () => { while (!peer.segments.has('kv')) await new Promise((r) => setTimeout(r, 20)) })(), 30_000, 'the kv segment')
        const before = agent.stats().rails
        const answer = new Promise<Notification>((resolve) => agent.once('notification', resolve))
        const result = await agent.write(peer, [{ local: [src, 0], remote: ['kv', 0], length: SIZE }], { notify: 'by name over rail 1', timeoutMs: 240_000 })
        expect(result.bytes).toBe(SIZE)
        expect((await within(answer, 120_000, 'host 0\'s verdict')).message).toBe('wrong 0')
        const after = agent.stats().rails
        console.log(`by name over rail 1: write ${result.ms.toFixed(0)} ms, rails before ${JSON.stringify(before)}, after ${JSON.stringify(after)}`)
        expect(after[1]!.bytes - before[1]!.bytes, 'every byte confirmed on rail 1').toBe(SIZE)
        expect(after[0]!.bytes - before[0]!.bytes, 'nothing on rail 0 (its wire is down)').toBe(0)
        // What it dialed: host 0's record lists both rails, in rail order.
        expect(target.addresses.map((a) => a.device), 'one address per rail, in rail order').toEqual(devices)
        expect(target.addresses.map((a) => a.host)).toEqual([process.env.SOFTROCE_PEER_ADDR, process.env.SOFTROCE_RAIL1_PEER_ADDR])
        expect(target.addresses[0]!.port).toBe(AGENT_PORT)
      } finally {
        if (down) execFileSync('ip', ['link', 'set', netdev, 'up'], { stdio: 'pipe', timeout: 30_000 })
        await agent.close()
      }
    }
  })
})
