// Two rails between the hosts: the two-host topology gives each guest a second
// wire (its own subnet) with its own rxe device, SOFTROCE_RAIL1_*. First the
// wire itself: rdma_cm across rail 1, on rxe1's PD, moves verified bytes.
// Then transfer agents with devices [rxe0, rxe1]: host 1 writes into host 0's
// segments (one shared, one granted to it alone: a window per QP on each
// rail), host 0 checks every byte, and both rails carried some. Last, rail 1's
// wire is taken down on host 1 in the middle of a write: the write completes
// on rail 0 with every byte right, and once the wire is back, a later
// transfer (on a link made anew) moves bytes on rail 1 again (docs/rails.md).
import { execFileSync } from 'node:child_process'
import { describe, expect } from 'vitest'
import { Access, TransferAgent, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, type Connection, type ConnectionRequest, type Notification, type Peer } from '../../dist/index.js'
import { envMissing, needs } from '../rdma/needs.js'
import { ALL_ACCESS, pattern, within } from '../rdma/helpers.js'

const role = process.env.SOFTROCE_HOST_INDEX
const test = needs(envMissing('SOFTROCE_HOST_INDEX', 'SOFTROCE_RAIL1_DEVICE', 'SOFTROCE_RAIL1_ADDR', 'SOFTROCE_RAIL1_PEER_ADDR'))
const WIRE_PORT = 7481
const AGENT_PORT = 7483
const FAILOVER_PORT = 7484
const FAILOVER_SIZE = 128 << 20
/**
 * The data QPs' ACK timeout, as test 20 has it (the emulated guests answer late). RAILS_ACK_TIMEOUT overrides it,
 * e.g. 14 (the engine's default) to measure rail-failure detection with the default retry timing.
 */
const ACK_TIMEOUT = process.env.RAILS_ACK_TIMEOUT === undefined ? 18 : Number(process.env.RAILS_ACK_TIMEOUT)
const SIZE = 8 << 20
const ROUNDS = 6
const devices = [process.env.SOFTROCE_DEVICE!, process.env.SOFTROCE_RAIL1_DEVICE!]

/** Round r's bytes at offset `at` of a segment: a tile of its own (4093 is prime: a slice landing elsewhere shows). */
function roundBytes(r: number, length: number): Buffer {
  return Buffer.alloc(length).fill(pattern(4093, 6000 + r))
}

async function connectRetrying(agent: TransferAgent, host: string, port: number): Promise<Peer> {
  for (let attempt = 0; ; attempt++) { // the far side may still be starting
    try {
      return await agent.connect({ host, port, timeoutMs: 10_000 })
    } catch (error) {
      if (attempt > 120) throw error
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
}

describe(`two rails (this is host ${role})`, () => {
  test('the second wire: rdma_cm on rxe1 across rail 1 moves verified bytes', async () => {
    const device = openDevice(process.env.SOFTROCE_RAIL1_DEVICE!)
    expect(device.name).toBe(process.env.SOFTROCE_RAIL1_DEVICE)
    expect(device.name).not.toBe(process.env.SOFTROCE_DEVICE)
    const pd = device.allocPd()
    const data = pattern(65536, 61)
    try {
      if (role === '0') {
        const region = pd.allocRegion(65536, ALL_ACCESS)
        const listener = await listen({ host: process.env.SOFTROCE_RAIL1_ADDR!, port: WIRE_PORT, pd })
        try {
          const request = await within(new Promise<ConnectionRequest>((resolve) => listener.once('request', resolve)), 120_000, 'the peer to connect on rail 1')
          const conn = await request.accept({ pd, privateData: encodeDescriptors([region.describe()]), receiveJson: true })
          expect(await within(conn.receiveJson(), 60_000, 'the peer to say it wrote')).toEqual({ wrote: 65536 })
          expect(Buffer.compare(region.bytes, data), 'what rail 1 delivered').toBe(0)
          await conn.sendJson({ checked: true })
          await within(new Promise((resolve) => conn.once('disconnected', resolve)), 60_000, 'the peer to disconnect')
          conn.close()
        } finally {
          listener.close()
          region.deregister()
        }
      } else {
        let conn: Connection | undefined
        for (let attempt = 0; !conn; attempt++) {
          try {
            conn = await connect({ host: process.env.SOFTROCE_RAIL1_PEER_ADDR!, port: WIRE_PORT, pd, receiveJson: true, timeoutMs: 30_000 })
          } catch (error) {
            if ((error as { code?: string }).code !== 'ECONNREFUSED' || attempt > 120) throw error
            await new Promise((resolve) => setTimeout(resolve, 500))
          }
        }
        const local = pd.allocRegion(65536, Access.LocalWrite)
        local.bytes.set(data)
        const remote = remoteRegion(decodeDescriptors(conn.privateData)[0]!)
        await conn.qp.write(local.slice(0, 65536), remote.slice(0, 65536))
        await conn.sendJson({ wrote: 65536 })
        expect(await within(conn.receiveJson(), 60_000, 'the peer to check')).toEqual({ checked: true })
        await conn.disconnect()
        local.deregister()
      }
    } finally {
      device.close()
    }
  })

  test('two rails both carry bytes: writes over rxe0 and rxe1 into a shared and a per-peer segment, every byte checked', async () => {
    if (role === '0') {
      const agent = await TransferAgent.create({ host: process.env.SOFTROCE_ADDR!, port: AGENT_PORT, name: 'rails-reader', devices, ackTimeout: ACK_TIMEOUT })
      try {
        const shared = agent.register('shared', { size: SIZE, remote: 'read-write' })
        const own = agent.register('own', { size: SIZE, remote: 'read-write', peers: ['rails-writer'] })
        const notification = await within(new Promise<Notification>((resolve) => agent.once('notification', resolve)), 300_000, 'the writer\'s notification')
        expect(notification.message).toBe('written')
        // Each round wrote its own tile over a region of both segments (the last round's wins where they overlap).
        const last = ROUNDS - 1
        const wrongShared = Buffer.compare(shared.bytes, roundBytes(last, SIZE)) !== 0
        const wrongOwn = Buffer.compare(own.bytes, roundBytes(last + 100, SIZE)) !== 0
        await agent.notify(notification.peer, `wrong ${Number(wrongShared) + Number(wrongOwn)}`, { timeoutMs: 30_000 })
        expect(wrongShared, 'the shared segment holds the last round\'s bytes').toBe(false)
        expect(wrongOwn, 'the per-peer segment holds the last round\'s bytes').toBe(false)
        await within(new Promise((resolve) => agent.once('peerLost', resolve)), 60_000, 'the writer to disconnect')
      } finally {
        await agent.close()
      }
    } else {
      const agent = await TransferAgent.create({ host: process.env.SOFTROCE_ADDR!, port: 0, name: 'rails-writer', devices, qpsPerPeer: 2, ackTimeout: ACK_TIMEOUT })
      try {
        expect(agent.stats().rails.map((r) => r.device)).toEqual(devices)
        const src = agent.register('src', { size: 2 * SIZE })
        const peer = await connectRetrying(agent, process.env.SOFTROCE_PEER_ADDR!, AGENT_PORT)
        await within((async () => { while (!peer.segments.has('own')) await new Promise((r) => setTimeout(r, 20)) })(), 30_000, 'the per-peer segment')
        const answer = new Promise<Notification>((resolve) => agent.once('notification', resolve))
        for (let r = 0; r < ROUNDS; r++) {
          src.bytes.set(roundBytes(r, SIZE), 0)
          src.bytes.set(roundBytes(r + 100, SIZE), SIZE)
          const result = await agent.write(peer, [
            { local: [src, 0], remote: ['shared', 0], length: SIZE },
            { local: [src, SIZE], remote: ['own', 0], length: SIZE },
          ], { timeoutMs: 120_000, ...(r === ROUNDS - 1 ? { notify: 'written' } : {}) })
          expect(result.bytes).toBe(2 * SIZE)
          expect(result.qps, 'lanes used: 2 per rail').toBe(4)
        }
        expect((await within(answer, 120_000, 'host 0\'s verdict')).message).toBe('wrong 0')
        const rails = agent.stats().rails
        console.log(`two rails: ${JSON.stringify(rails)}`)
        expect(rails.every((r) => r.bytes > 0), 'every rail carried bytes').toBe(true)
        expect(rails.reduce((sum, r) => sum + r.bytes, 0)).toBe(ROUNDS * 2 * SIZE)
      } finally {
        await agent.close()
      }
    }
  })

  test('rail 1 taken down mid-write: the write completes on rail 0, every byte checked; the rail is used again later', async () => {
    if (role === '0') {
      const agent = await TransferAgent.create({ host: process.env.SOFTROCE_ADDR!, port: FAILOVER_PORT, name: 'failover-reader', devices, ackTimeout: ACK_TIMEOUT })
      try {
        const kv = agent.register('kv', { size: FAILOVER_SIZE, remote: 'read-write' })
        for (const [round, seed] of [['failover', 7001], ['retried', 7002]] as const) {
          const notification = await within(new Promise<Notification>((resolve) => agent.once('notification', resolve)), 300_000, `the writer's '${round}' notification`)
          expect(notification.message).toBe(round)
          const wrong = Buffer.compare(kv.bytes, Buffer.alloc(FAILOVER_SIZE).fill(pattern(4093, seed))) !== 0
          await agent.notify(notification.peer, `wrong ${Number(wrong)}`, { timeoutMs: 30_000 })
          expect(wrong, `the bytes of the '${round}' write`).toBe(false)
        }
        await within(new Promise((resolve) => agent.once('peerLost', resolve)), 60_000, 'the writer to disconnect')
      } finally {
        await agent.close()
      }
    } else {
      const netdev = process.env.SOFTROCE_RAIL1_NETDEV!
      // The stall bound well above rail 1's RC retries (7 x 1.07 s at ackTimeout 18): lanes of rail 0 may be idle meanwhile.
      const agent = await TransferAgent.create({ host: process.env.SOFTROCE_ADDR!, port: 0, name: 'failover-writer', devices, qpsPerPeer: 2, ackTimeout: ACK_TIMEOUT, stallTimeoutMs: 120_000 })
      let down = false
      try {
        const src = agent.register('src', { size: FAILOVER_SIZE })
        const peer = await connectRetrying(agent, process.env.SOFTROCE_PEER_ADDR!, FAILOVER_PORT)
        await within((async () => { while (!peer.segments.has('kv')) await new Promise((r) => setTimeout(r, 20)) })(), 30_000, 'the kv segment')
        src.bytes.set(Buffer.alloc(FAILOVER_SIZE).fill(pattern(4093, 7001)))
        const before = agent.stats().rails
        let answer = new Promise<Notification>((resolve) => agent.once('notification', resolve))
        // Timing (reported, never asserted: the guests are emulated and shared): the wire down, the rail's failover seen in stats(), the write done.
        let execAt = 0
        let wireDownAt = 0
        let failoverAt = 0
        const watch = setInterval(() => { if (failoverAt === 0 && agent.stats().rails[1]!.failovers > before[1]!.failovers) failoverAt = performance.now() }, 5)
        const result = await agent.write(peer, [{ local: [src, 0], remote: ['kv', 0], length: FAILOVER_SIZE }], {
          notify: 'failover', timeoutMs: 240_000,
          // At the first batch confirmed. 128 MiB: spawning `ip` in the emulated guest, busy with rxe, takes seconds,
          // and a rail must still have most of its share to go when its wire is down (32 MiB were all sent by then).
          onProgress: (confirmed, total) => {
            if (down || confirmed >= total) return
            down = true
            execAt = performance.now()
            execFileSync('ip', ['link', 'set', netdev, 'down'], { stdio: 'pipe', timeout: 30_000 })
            wireDownAt = performance.now() // the wire went down somewhere in the `ip` call, which blocks the event loop

          },
        }).finally(() => clearInterval(watch))
        const doneAt = performance.now()
        console.log(`failover write: ${result.ms.toFixed(0)} ms, rails ${JSON.stringify(agent.stats().rails)}`)
        console.log(`rail failure timing (ackTimeout ${ACK_TIMEOUT}): \`ip link set down\` took ${(wireDownAt - execAt).toFixed(0)} ms; from its return: failover seen ${failoverAt > 0 ? (failoverAt - wireDownAt).toFixed(0) : '?'} ms, ` +
          `-> write complete ${(doneAt - wireDownAt).toFixed(0)} ms (write ${result.ms.toFixed(0)} ms, ${FAILOVER_SIZE >> 20} MiB)`)
        expect(down, 'rail 1 went down during the write').toBe(true)
        expect(result.bytes).toBe(FAILOVER_SIZE)
        expect((await within(answer, 120_000, 'host 0\'s verdict')).message).toBe('wrong 0')
        const after = agent.stats().rails
        console.log(`rail failover: before ${JSON.stringify(before)}, after ${JSON.stringify(after)}`)
        expect(after[1]!.failovers, 'rail 1 failed once').toBe(1)
        expect(after[0]!.bytes - before[0]!.bytes + after[1]!.bytes - before[1]!.bytes, 'every byte confirmed once, on one rail or the other').toBe(FAILOVER_SIZE)
        expect(after[0]!.bytes - before[0]!.bytes, 'rail 0 took over rail 1\'s share').toBeGreaterThan(FAILOVER_SIZE / 2)
        expect(peer.state).toBe('connected')

        // The wire back: a transfer after the retry delay makes the link anew, with rail 1 in it again.
        execFileSync('ip', ['link', 'set', netdev, 'up'], { stdio: 'pipe', timeout: 30_000 })
        down = false
        await new Promise((resolve) => setTimeout(resolve, 6000))
        src.bytes.set(Buffer.alloc(FAILOVER_SIZE).fill(pattern(4093, 7002)))
        answer = new Promise<Notification>((resolve) => agent.once('notification', resolve))
        const again = await agent.write(peer, [{ local: [src, 0], remote: ['kv', 0], length: FAILOVER_SIZE }], { notify: 'retried', timeoutMs: 240_000 })
        expect(again.bytes).toBe(FAILOVER_SIZE)
        expect((await within(answer, 120_000, 'host 0\'s second verdict')).message).toBe('wrong 0')
        const last = agent.stats().rails
        console.log(`rail retried: ${JSON.stringify(last)}`)
        expect(last[1]!.bytes, 'rail 1 carried bytes again').toBeGreaterThan(after[1]!.bytes)
        expect(peer.stats().reconnects, 'the link was made anew once').toBe(1)
      } finally {
        if (down) execFileSync('ip', ['link', 'set', netdev, 'up'], { stdio: 'pipe', timeout: 30_000 })
        await agent.close()
      }
    }
  })
})
