// "GC is a safety net": objects the program drops with nothing in flight are
// collected and their native handles freed, counted in the kernel (rdma
// resource show, /proc/self/fd), not only through WeakRefs. A request in
// flight keeps what it needs alive until it settles, even when the program
// holds nothing but its promise. Needs --expose-gc (vitest.rdma.config.ts).
import { describe, expect, it } from 'vitest'
import v8 from 'node:v8'
import { Access, connect, listen, type Connection, type Device } from '../../dist/index.js'
import { ALL_ACCESS, pattern, testDevice, within } from './helpers.js'
import { countAll, countResources } from './resources.js'

const gc = (globalThis as { gc?: () => void }).gc

/**
 * Collects until every WeakRef is cleared and `freed()` holds (bounded). It
 * takes several rounds: native finalizers run after a GC, and only then do
 * the parents they held become garbage.
 */
async function collect(refs: Array<WeakRef<object>>, freed: () => boolean): Promise<boolean> {
  const started = Date.now()
  for (let round = 1; round <= 100; round++) {
    // A turn first: deref() keeps a live target alive until the current job ends.
    await new Promise((resolve) => setTimeout(resolve, 50))
    gc!()
    if (refs.every((r) => r.deref() === undefined) && freed()) {
      console.log(`collected after ${round} GC rounds, ${Date.now() - started} ms`)
      return true
    }
  }
  return false
}

/** A QP on a PD, CQ and region of its own, whose receives were posted and then flushed (QP moved to ERR): nothing is in flight. */
async function qpWithSettledReceives(device: Device): Promise<Array<WeakRef<object>>> {
  const pd = device.allocPd()
  const cq = device.createCq({ entries: 64 })
  const qp = pd.createQp({ type: 'RC', sendCq: cq })
  const region = pd.allocRegion(4096, Access.LocalWrite)
  qp.modify('INIT', { pkeyIndex: 0, portNum: 1, accessFlags: Access.LocalWrite })
  const receives = Array.from({ length: 4 }, (_, i) => qp.recv(region.slice(i * 64, 64)))
  expect(qp.outstanding).toBe(4)
  qp.modify('ERR')
  const outcomes = await within(Promise.allSettled(receives), 10_000, 'the flushed receives')
  expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected', 'rejected', 'rejected'])
  expect(qp.outstanding).toBe(0)
  return [pd, cq, qp, region].map((o) => new WeakRef(o))
}

/**
 * The counts once garbage left by earlier files of this process (they share
 * it) is collected: a baseline that later collections cannot lower.
 */
async function baseline(): Promise<ReturnType<typeof countAll>> {
  let last = JSON.stringify(countAll())
  for (let round = 0; round < 50; round++) {
    await gcRounds(3)
    const now = JSON.stringify(countAll())
    if (now === last) break
    last = now
  }
  return JSON.parse(last) as ReturnType<typeof countAll>
}

/** GC rounds with a turn of the loop between them (native finalizers run after a GC). */
async function gcRounds(rounds: number): Promise<void> {
  for (let i = 0; i < rounds; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20))
    gc!()
  }
}

describe('garbage collection frees native handles', () => {
  it('a dropped QP whose requests settled', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const device = testDevice()
    try {
      const before = await baseline()
      const refs = await qpWithSettledReceives(device)
      expect(countResources('qp')).toBe(before.qp + 1)
      const freed = await collect(refs, () => JSON.stringify(countAll()) === JSON.stringify(before))
      expect(refs.map((r) => r.deref() === undefined)).toEqual([true, true, true, true])
      expect(countAll()).toEqual(before)
      expect(freed).toBe(true)
    } finally {
      device.close()
    }
  }, 180_000)

  it('a dropped device with everything under it', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const before = await baseline()
    const refs = await (async () => {
      const device = testDevice()
      return [new WeakRef(device), ...await qpWithSettledReceives(device)]
    })()
    const freed = await collect(refs, () => JSON.stringify(countAll()) === JSON.stringify(before))
    expect(refs.map((r) => r.deref() === undefined)).toEqual([true, true, true, true, true])
    expect(freed).toBe(true)
    expect(countAll()).toEqual(before)
  }, 180_000)

  it('a long-lived PD forgets the children the GC collected: their WeakRefs do not pile up in it', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const device = testDevice()
    try {
      const pd = device.allocPd()
      const mrs = countResources('mr')
      const N = 300
      // Live WeakRefs in the whole heap (V8 counts them after a full GC), once cleanup callbacks had their turns.
      const weakRefs = async (): Promise<number> => {
        await gcRounds(5)
        return (v8 as unknown as { queryObjects(ctor: unknown, options: { format: 'count' }): number }).queryObjects(WeakRef, { format: 'count' })
      }
      const dropRegions = async (): Promise<void> => {
        for (let i = 0; i < N; i++) pd.allocRegion(4096)
        for (let round = 0; round < 100 && countResources('mr') !== mrs; round++) await gcRounds(1)
        expect(countResources('mr'), 'the dropped regions were collected (their native finalizers ran)').toBe(mrs)
      }
      await dropRegions() // first: whatever a first use allocates for good
      const before = await weakRefs()
      await dropRegions()
      const after = await weakRefs()
      console.log(`WeakRefs in the heap: ${before} before, ${after} after ${N} regions of one PD were dropped and collected`)
      expect(after - before, `WeakRefs left behind by ${N} collected regions of a PD that stays open`).toBeLessThan(N / 10)
      expect(pd.closed).toBe(false)
    } finally {
      device.close()
    }
  }, 180_000)

  it('a dropped QP with a receive in flight stays alive until it settles: a message sent later arrives', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const device = testDevice()
    try {
      const pd = device.allocPd()
      const cq = device.createCq()
      const sender = pd.createQp({ type: 'RC', sendCq: cq })
      const region = pd.allocRegion(4096, Access.LocalWrite)
      // The receiving side: nothing of it is referenced below but the promise of its receive.
      const { endpoint, received, ref } = await (async () => {
        const rpd = device.allocPd()
        const rcq = device.createCq()
        const qp = rpd.createQp({ type: 'RC', sendCq: rcq })
        const buffer = rpd.allocRegion(4096, Access.LocalWrite)
        await qp.connect(sender.endpoint())
        const received = qp.recv(buffer.slice(0, 256)).then(() => Buffer.from(buffer.bytes.subarray(0, 256)))
        return { endpoint: qp.endpoint(), received, ref: new WeakRef(qp) }
      })()
      await sender.connect(endpoint)
      await gcRounds(20)
      expect(ref.deref(), 'the QP with a receive in flight').toBeDefined()
      region.bytes.set(pattern(256, 3))
      await sender.send(region.slice(0, 256))
      expect(Buffer.compare(await within(received, 10_000, 'the receive'), pattern(256, 3))).toBe(0)
    } finally {
      device.close()
    }
  }, 60_000)

  it('a connected QP that nothing references keeps serving a peer\'s one-sided WRITEs (it was collected, and the WRITEs hung), and is collected once in error', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const device = testDevice()
    try {
      const pd = device.allocPd()
      const cq = device.createCq()
      const writer = pd.createQp({ type: 'RC', sendCq: cq })
      const source = pd.allocRegion(4096, ALL_ACCESS)
      const target = pd.allocRegion(4096, ALL_ACCESS)
      // The responder: a WRITE needs no request of its own, so nothing but
      // the WeakRef names it once this returns.
      const { endpoint, ref } = await (async () => {
        const qp = pd.createQp({ type: 'RC', sendCq: device.createCq() })
        await qp.connect(writer.endpoint())
        return { endpoint: qp.endpoint(), ref: new WeakRef(qp) }
      })()
      await writer.connect(endpoint)
      await gcRounds(20)
      expect(ref.deref(), 'the connected responder').toBeDefined()
      source.bytes.set(pattern(4096, 5))
      await within(writer.write(source.slice(0, 4096), target.asRemote().slice(0, 4096), { timeoutMs: 10_000 }), 15_000, 'the WRITE')
      expect(Buffer.compare(target.bytes, pattern(4096, 5))).toBe(0)
      // In the error state no peer can use it: it is collectable again.
      ref.deref()!.modify('ERR')
      expect(await collect([ref], () => true)).toBe(true)
    } finally {
      device.close()
    }
  }, 120_000)

  it('an accepted connection that only a loop awaiting receiveJson() references keeps serving (it was collected and its peer saw a disconnect)', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
    const device = testDevice()
    const pd = device.allocPd()
    const listener = await listen({ host, port: 0, pd })
    const got: unknown[] = []
    let served!: (outcome: string) => void
    const serving = new Promise<string>((resolve) => { served = resolve })
    listener.on('request', (request) => {
      void request.accept({ receiveJson: true }).then(async (conn) => {
        for (;;) {
          const message = (await conn.receiveJson()) as { n?: number; done?: boolean }
          got.push(message)
          if (message.done) break
        }
        served('done') // the connection stays open: the client's close() ends it

      }).catch((error: unknown) => served(`failed: ${String(error)}`))
    })
    let client: Connection | undefined
    try {
      client = await connect({ host, port: listener.address!.port, pd, timeoutMs: 30_000 })
      let disconnected = false
      client.on('disconnected', () => { disconnected = true })
      await gcRounds(20)
      await client.sendJson({ n: 1 })
      await gcRounds(5)
      await client.sendJson({ done: true })
      expect(await within(serving, 30_000, 'the server loop')).toBe('done')
      expect(got).toEqual([{ n: 1 }, { done: true }])
      expect(disconnected, 'the client saw a disconnect before it was done').toBe(false)
    } finally {
      client?.close()
      listener.close()
      device.close()
    }
  }, 120_000)
})
