// Transfer agents that find each other through a real etcd (Debian's
// etcd-server, started here on free ports of the guest's loopback with a
// tmpfs data dir): a peer reached by name moves verified bytes; a peer that
// stops (frozen, or killed) leaves the cluster within TTL + 1 s and its links
// fail with ERR_PEER_GONE; a restart under the same name and port is a new
// incarnation, the old endpoint is refused with ERR_STALE_PEER and the handle
// reconnects on its next transfer; etcd killed mid-transfer: the established
// link completes every byte, lookups of unknown peers fail coded, and the
// agents register again when etcd is back (without its data); concurrent
// connects by name share one handshake (one link, no notification lost).
import { afterAll, beforeAll, describe, expect } from 'vitest'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { TransferAgent, type Block, type Peer, type PeerLeftEvent, type PeerLostEvent, type PeerRecord, type Segment } from '../../dist/index.js'
import { etcdBinary, startEtcd, type EtcdServer } from '../../scripts/etcd-server.mjs'
import { needs } from './needs.js'
import { pattern, within } from './helpers.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
// The lease of the peers whose departure is timed (decode-2 frozen, decode-3 killed): short, to keep
// those waits short. NODE_IBVERBS_ETCD_TTL sets it (a slower build or machine: a longer lease).
const TTL = Number(process.env.NODE_IBVERBS_ETCD_TTL || 3) // seconds
// Every other agent's (this one's, decode-1, -4, -5): a keep-alive late by more than a short TTL on a
// starved guest lapses the lease, and the watch then reports the agent gone, rightly: tests that need
// an agent to stay listed give it a lease no starvation outlasts.
const LONG_TTL = 5 * TTL
// A bound on each etcd request: etcd on a starved guest took more than 2 s to grant a lease.
const REQUEST_TIMEOUT_MS = 10_000
const SIZE = 4 << 20
const BLOCK = 4096
const it = needs(etcdBinary() ? undefined : "etcd is not installed (Debian's etcd-server: bash scripts/softroce.sh provision)")

interface Child { process: ChildProcess; port: number; incarnation: string; sum: (offset: number, length: number) => Promise<number>; notices: () => Promise<string[]>; stop: () => Promise<void> }

const children = new Set<Child>()

function startChild(name: string, port = 0, ttl = LONG_TTL): Promise<Child> {
  const script = fileURLToPath(new URL('./fixtures/transfer-etcd-peer.mjs', import.meta.url))
  const child = spawn(process.execPath, [script, host, String(port), String(SIZE), name, etcd!.endpoint, String(ttl), String(REQUEST_TIMEOUT_MS)], { stdio: ['pipe', 'pipe', 'inherit'] })
  let out = ''
  const waiters: Array<(line: string) => void> = []
  child.stdout!.on('data', (chunk) => {
    out += chunk
    let nl
    while ((nl = out.indexOf('\n')) >= 0) {
      const line = out.slice(0, nl)
      out = out.slice(nl + 1)
      waiters.shift()?.(line)
    }
  })
  const nextLine = () => new Promise<string>((resolve) => waiters.push(resolve))
  const exited = () => child.exitCode !== null || child.signalCode !== null
  // A child that exits before it listens (its error is on stderr) fails the start at once.
  const died = new Promise<string>((_, reject) => child.once('exit', (code, signal) => reject(new Error(`the child agent ${name} exited (${code ?? signal}) before it listened`))))
  died.catch(() => undefined)
  return within(Promise.race([nextLine(), died]).then((line) => {
    const match = line.match(/^listening (\d+) (\S+)/)
    if (!match) throw new Error(`child said: ${line}`)
    const handle: Child = {
      process: child,
      port: Number(match[1]),
      incarnation: match[2]!,
      sum: async (offset, length) => {
        const reply = nextLine()
        child.stdin!.write(`sum ${offset} ${length}\n`)
        return Number((await within(reply, 30_000, 'the child\'s checksum')).split(' ')[1])
      },
      notices: async () => {
        const reply = nextLine()
        child.stdin!.write('notices\n')
        const [, count, list] = (await within(reply, 30_000, 'the child\'s notices')).split(' ')
        const messages = list ? list.split(',') : []
        expect(messages).toHaveLength(Number(count))
        return messages
      },
      stop: () => new Promise<void>((done) => {
        children.delete(handle)
        if (exited()) return done()
        child.once('exit', () => done())
        child.kill('SIGCONT') // a frozen child must run to close
        child.stdin!.end()
        setTimeout(() => child.kill('SIGKILL'), 10_000).unref()
      }),
    }
    children.add(handle)
    return handle
  }), 60_000, `the child agent ${name} to start`)
}

const kill = (child: Child) => new Promise<void>((resolve) => {
  children.delete(child)
  if (child.process.exitCode !== null || child.process.signalCode !== null) return resolve()
  child.process.once('exit', () => resolve())
  child.process.kill('SIGKILL')
})

function checksum(bytes: Uint8Array): number {
  let sum = 0
  for (const byte of bytes) sum = (sum * 31 + byte) >>> 0
  return sum
}

/** The next `event` of the agent for which `match` holds, within `ms`. */
function next<T>(agent: TransferAgent, event: 'peerJoined' | 'peerLeft' | 'peerLost' | 'metadata', match: (value: T) => boolean, ms: number, what: string): Promise<T> {
  let listener!: (value: T) => void
  const seen = new Promise<T>((resolve) => {
    listener = (value: T) => { if (match(value)) resolve(value) }
    agent.on(event as 'peerJoined', listener as unknown as (record: PeerRecord) => void)
  })
  const outcome = within(seen, ms, what).finally(() => agent.off(event as 'peerJoined', listener as unknown as (record: PeerRecord) => void))
  outcome.catch(() => undefined) // awaited by the test; one that failed earlier leaves no unhandled rejection
  return outcome
}

let etcd: EtcdServer | undefined
let agent: TransferAgent
let src: Segment
let back: Segment
// 4 KiB blocks placed shuffled over the peer's segment; `expected` is the peer's segment after the write.
const blocks: Block[] = []
const expected = new Uint8Array(SIZE)

beforeAll(async () => {
  if (!etcdBinary()) return
  etcd = await startEtcd()
  agent = await TransferAgent.create({ host, name: 'prefill-0', metadata: { endpoints: [etcd.endpoint], ttlSeconds: LONG_TTL, requestTimeoutMs: REQUEST_TIMEOUT_MS } })
  src = agent.register('src', { size: SIZE })
  back = agent.register('back', { size: SIZE })
  src.bytes.set(pattern(SIZE, 11))
  for (let i = 0; i < SIZE / BLOCK; i++) {
    const at = ((i * 4099) % (SIZE / BLOCK)) * BLOCK
    blocks.push({ local: [src, i * BLOCK], remote: ['kv', at], length: BLOCK })
    expected.set(src.bytes.subarray(i * BLOCK, (i + 1) * BLOCK), at)
  }
}, 120_000)

afterAll(async () => {
  for (const child of [...children]) await child.stop()
  await agent?.close()
  await etcd?.stop()
})

/** Writes the blocks to the peer and checks every byte there: read back whole, and a sample summed by the peer itself. */
async function writeAndCheck(peer: Peer, child: Child): Promise<void> {
  back.bytes.fill(0)
  const written = await within(agent.write(peer, blocks, { timeoutMs: 60_000 }), 65_000, 'the write')
  expect(written.bytes).toBe(SIZE)
  await within(agent.read(peer, [{ local: [back, 0], remote: ['kv', 0], length: SIZE }], { timeoutMs: 60_000 }), 65_000, 'the read back')
  expect(Buffer.compare(back.bytes, expected), 'every byte of the peer\'s segment').toBe(0)
  for (const at of [0, BLOCK * 7, SIZE - BLOCK]) expect(await child.sum(at, BLOCK), `the peer's own sum at ${at}`).toBe(checksum(expected.subarray(at, at + BLOCK)))
}

describe('transfer agents on etcd', () => {
  it('find each other by name: connect(name) moves verified bytes; a name nobody has is ERR_PEER_UNKNOWN', async () => {
    const joined = next<PeerRecord>(agent, 'peerJoined', (r) => r.name === 'decode-1', 60_000, 'decode-1 joined')
    const child = await startChild('decode-1')
    const record = await joined
    expect(record).toMatchObject({ name: 'decode-1', incarnation: child.incarnation, addresses: [{ host, port: child.port }] })
    expect(agent.members().get('decode-1')?.incarnation).toBe(child.incarnation)
    const peer = await within(agent.connect('decode-1', { timeoutMs: 30_000 }), 35_000, 'connect by name')
    expect(peer.id).toBe(child.incarnation)
    expect(peer.name).toBe('decode-1')
    await writeAndCheck(peer, child)
    expect(await agent.connect('decode-1')).toBe(peer) // connected: the same handle
    const unknown = await within(agent.connect('nobody').catch((e) => e), 10_000, 'connect to nobody')
    expect(unknown.code).toBe('ERR_PEER_UNKNOWN')
    // The child sees this agent too (its watch).
    await child.stop()
  }, 180_000)

  it('concurrent connect(name) calls to a peer not yet connected share one handshake: one link, and every notified write is notified', async () => {
    const joined = next<PeerRecord>(agent, 'peerJoined', (r) => r.name === 'decode-5', 60_000, 'decode-5 joined')
    const child = await startChild('decode-5')
    await joined // in the view: every connect below finds the record there at once
    // As a router's requests do: each connects by name, then writes with a notification, all at once.
    const peers = await within(Promise.all([0, 1, 2, 3].map(() => agent.connect('decode-5', { timeoutMs: 30_000 }))), 35_000, 'four connects by name')
    expect(new Set(peers).size).toBe(1)
    const peer = peers[0]!
    await within(Promise.all(peers.map((p, i) => agent.write(p, blocks.slice(i * 8, i * 8 + 8), { notify: `w${i}`, timeoutMs: 30_000 }))), 35_000, 'four notified writes')
    // A second link to the same agent replaced the first on both sides: a write that completed on the first lost its notification.
    expect(peer.stats().reconnects, 'links made after the first').toBe(0)
    let notices: string[] = []
    for (const deadline = Date.now() + 10_000; notices.length < 4 && Date.now() < deadline;) {
      notices = await child.notices()
      if (notices.length < 4) await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect(notices.sort(), 'the notifications the peer got').toEqual(['w0', 'w1', 'w2', 'w3'])
    await child.stop()
  }, 180_000)

  it('a frozen peer leaves within TTL + 1 s, its link failed with ERR_PEER_GONE at once; a restart on the same port is a new incarnation: the old endpoint is refused, the handle reconnects', async () => {
    let child = await startChild('decode-2', 0, TTL)
    const peer = await within(agent.connect('decode-2', { timeoutMs: 30_000 }), 35_000, 'connect by name')
    await writeAndCheck(peer, child)
    const oldRecord = agent.members().get('decode-2')!
    expect(oldRecord.incarnation).toBe(child.incarnation)

    // Frozen (SIGSTOP): no keep-alive, no disconnect, and its device still answers RDMA; only the lease says it is gone.
    const left = next<PeerLeftEvent>(agent, 'peerLeft', (e) => e.record.incarnation === child.incarnation, TTL * 1000 + 1000, 'peerLeft within TTL + 1 s')
    const lost = next<PeerLostEvent>(agent, 'peerLost', (e) => e.peer === peer, TTL * 1000 + 1000, 'peerLost within TTL + 1 s')
    const stopped = Date.now()
    child.process.kill('SIGSTOP')
    const event = await left
    const detectedMs = Date.now() - stopped
    expect(event.reason).toBe('deleted')
    expect((await lost).error.code).toBe('ERR_PEER_GONE')
    expect(peer.state).toBe('broken')
    expect(peer.error?.code).toBe('ERR_PEER_GONE')
    const gone = await within(agent.write(peer, blocks.slice(0, 4), { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'a write to the departed peer')
    expect(gone.code).toBe('ERR_PEER_GONE')

    // Killed, and started again under the same name on the same port: another incarnation.
    await kill(child)
    const rejoined = next<PeerRecord>(agent, 'peerJoined', (r) => r.name === 'decode-2', 60_000, 'decode-2 joined again')
    child = await startChild('decode-2', oldRecord.addresses[0]!.port)
    expect(child.port).toBe(oldRecord.addresses[0]!.port)
    expect(child.incarnation).not.toBe(oldRecord.incarnation)
    await rejoined
    const registeredAt = Date.now()
    // The old record names the old incarnation: the agent that listens there now refuses it.
    const stale = await within(agent.connect(oldRecord, { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'connect to the old record')
    expect(stale.code).toBe('ERR_STALE_PEER')
    expect(stale.message).toContain(child.incarnation)
    // The handle's next transfer looks the name up again and reconnects to the new incarnation.
    const reconnectStarted = Date.now()
    await within(agent.write(peer, blocks.slice(0, 1), { timeoutMs: 30_000 }), 35_000, 'the first write after the restart')
    const reconnectMs = Date.now() - reconnectStarted
    expect(peer.id).toBe(child.incarnation)
    expect(peer.state).toBe('connected')
    await writeAndCheck(peer, child)
    console.log(`figures: lease expiry of a frozen peer detected ${detectedMs} ms after SIGSTOP (TTL ${TTL} s); ` +
      `after the restart, the first write reconnected and completed in ${reconnectMs} ms (${reconnectStarted - registeredAt} ms after its peerJoined, spent on the stale-endpoint check)`)
    await child.stop()
  }, 240_000)

  it('a killed peer (kill -9) leaves within TTL + 1 s; its link is failed, and transfers to it fail with ERR_PEER_GONE', async () => {
    const child = await startChild('decode-3', 0, TTL)
    const peer = await within(agent.connect('decode-3', { timeoutMs: 30_000 }), 35_000, 'connect by name')
    await within(agent.write(peer, blocks.slice(0, 64), { timeoutMs: 30_000 }), 35_000, 'a first write')
    const left = next<PeerLeftEvent>(agent, 'peerLeft', (e) => e.record.incarnation === child.incarnation, TTL * 1000 + 1000, 'peerLeft within TTL + 1 s')
    const killed = Date.now()
    await kill(child)
    await left
    const detectedMs = Date.now() - killed
    // The kernel closed the dead process's connection (a DREQ: ECONNRESET) or the lease expired first (ERR_PEER_GONE).
    expect(peer.state).toBe('broken')
    expect(['ECONNRESET', 'ERR_PEER_GONE']).toContain(peer.error?.code)
    const gone = await within(agent.write(peer, blocks.slice(0, 4), { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'a write to the dead peer')
    expect(gone.code).toBe('ERR_PEER_GONE')
    console.log(`figures: a killed peer left the view ${detectedMs} ms after SIGKILL (TTL ${TTL} s); its link had failed with ${peer.error?.code}`)
  }, 180_000)

  it('etcd killed mid-transfer: the established link completes every byte, unknown lookups fail coded, the agents register again when etcd is back', async () => {
    const child = await startChild('decode-4')
    const peer = await within(agent.connect('decode-4', { timeoutMs: 30_000 }), 35_000, 'connect by name')
    await within(agent.write(peer, blocks.slice(0, 16), { timeoutMs: 30_000 }), 35_000, 'a first write')
    const unavailable = next<{ state: string }>(agent, 'metadata', (e) => e.state === 'unavailable', 30_000, 'the agent to see etcd unavailable')
    const left: PeerLeftEvent[] = []
    const onLeft = (e: PeerLeftEvent) => left.push(e)
    agent.on('peerLeft', onLeft)
    back.bytes.fill(0)
    const inFlight = agent.write(peer, blocks, { timeoutMs: 60_000 })
    await etcd!.kill()
    const during = agent.write(peer, blocks.slice(0, 8), { timeoutMs: 60_000 }) // started with etcd dead
    expect((await within(inFlight, 65_000, 'the write in flight')).bytes).toBe(SIZE)
    expect((await within(during, 65_000, 'the write during the outage')).bytes).toBe(8 * BLOCK)
    await within(agent.read(peer, [{ local: [back, 0], remote: ['kv', 0], length: SIZE }], { timeoutMs: 60_000 }), 65_000, 'the read back')
    expect(Buffer.compare(back.bytes, expected), 'every byte of the peer\'s segment').toBe(0)
    await unavailable
    expect(agent.metadataState).toBe('unavailable')
    const lookup = await within(agent.connect('nobody', { timeoutMs: 10_000 }).catch((e) => e), 15_000, 'a lookup with etcd down')
    expect(lookup.code).toBe('ERR_METADATA_UNAVAILABLE')

    // Back without its data (as after losing it): both agents register again, under new leases, without a restart.
    const registered = next<{ state: string }>(agent, 'metadata', (e) => e.state === 'registered', 30_000, 'the agent to register again')
    await etcd!.start({ fresh: true })
    await registered
    const readKey = async (name: string) => {
      const r = await fetch(`${etcd!.endpoint}/v3/kv/range`, { method: 'POST', body: JSON.stringify({ key: Buffer.from(`/node-ibverbs/transfer/agents/${name}`).toString('base64') }) })
      const kvs = ((await r.json()) as { kvs?: Array<{ value: string; lease?: string }> }).kvs ?? []
      return kvs[0] ? { ...JSON.parse(Buffer.from(kvs[0].value, 'base64').toString()), lease: kvs[0].lease } as { incarnation: string; lease?: string } : undefined
    }
    // Each key is awaited (bounded), not read once: the agents register again on their own schedule.
    const deadline = Date.now() + LONG_TTL * 1000 + 5000
    while (!(await readKey('prefill-0')) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100))
    expect((await readKey('prefill-0'))?.incarnation).toBe(agent.id)
    while (!(await readKey('decode-4')) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100))
    const record = await readKey('decode-4')
    expect(record?.incarnation).toBe(child.incarnation)
    expect(record?.lease).toBeTruthy()
    // Nobody was taken for gone (a member missing from the listing after the outage is given its TTL
    // and a second to come back); the link never broke; it still moves data.
    await new Promise((resolve) => setTimeout(resolve, LONG_TTL * 1000 + 1500))
    agent.off('peerLeft', onLeft)
    expect(left).toEqual([])
    expect(peer.state).toBe('connected')
    await writeAndCheck(peer, child)
    await child.stop()
  }, 240_000)
})
