// "GC is a safety net": objects the program drops, even with requests still
// in flight (receives no message filled), are collected and their native
// handles freed. Counted in the kernel (rdma resource show, /proc/self/fd),
// not only through WeakRefs. Needs --expose-gc (vitest.rdma.config.ts).
import { describe, expect, it } from 'vitest'
import { Access, type Device } from '../../dist/index.js'
import { testDevice } from './helpers.js'
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

/** A QP in INIT with receives posted that nothing will fill, on a PD, CQ and region of its own. */
function qpWithReceives(device: Device): Array<WeakRef<object>> {
  const pd = device.allocPd()
  const cq = device.createCq({ entries: 64 })
  const qp = pd.createQp({ type: 'RC', sendCq: cq })
  const region = pd.allocRegion(4096, Access.LocalWrite)
  qp.modify('INIT', { pkeyIndex: 0, portNum: 1, accessFlags: Access.LocalWrite })
  for (let i = 0; i < 4; i++) qp.recv(region.slice(i * 64, 64)).catch(() => {})
  expect(qp.outstanding).toBe(4)
  return [pd, cq, qp, region].map((o) => new WeakRef(o))
}

describe('garbage collection frees native handles', () => {
  it('a dropped QP with receives in flight', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const device = testDevice()
    try {
      const before = countAll()
      const refs = qpWithReceives(device)
      expect(countResources('qp')).toBe(before.qp + 1)
      const freed = await collect(refs, () => JSON.stringify(countAll()) === JSON.stringify(before))
      expect(refs.map((r) => r.deref() === undefined)).toEqual([true, true, true, true])
      expect(freed).toBe(true)
      expect(countAll()).toEqual(before)
    } finally {
      device.close()
    }
  }, 180_000)

  it('a dropped device with everything under it', async () => {
    expect(gc, 'run with --expose-gc').toBeTypeOf('function')
    const before = countAll()
    const refs = (() => {
      const device = testDevice()
      return [new WeakRef(device), ...qpWithReceives(device)]
    })()
    const freed = await collect(refs, () => JSON.stringify(countAll()) === JSON.stringify(before))
    expect(refs.map((r) => r.deref() === undefined)).toEqual([true, true, true, true, true])
    expect(freed).toBe(true)
    expect(countAll()).toEqual(before)
  }, 180_000)
})
