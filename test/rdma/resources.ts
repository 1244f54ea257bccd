// Counts of the kernel's RDMA objects owned by this process, from iproute2's
// `rdma resource show` (what the device really holds, not what JS thinks).
import { execFileSync } from 'node:child_process'
import { readdirSync, readlinkSync } from 'node:fs'

/** The kinds `rdma resource show` lists per process. */
export type ResourceKind = 'ctx' | 'pd' | 'cq' | 'qp' | 'mr' | 'srq' | 'cm_id'

/** Number of `kind` objects of this process on any RDMA device. */
export function countResources(kind: ResourceKind): number {
  const out = execFileSync('rdma', ['-j', 'resource', 'show', kind], { encoding: 'utf8', timeout: 30_000 })
  const rows = JSON.parse(out || '[]') as Array<{ pid?: number }>
  return rows.filter((row) => row.pid === process.pid).length
}

/**
 * Number of memory regions of the protection domain that holds the region
 * with `lkey` (its pdn, as `rdma resource show mr` lists it): unlike a count
 * of the process's MRs, regions of other PDs that the collector frees
 * meanwhile (an earlier test file's garbage) do not move it.
 */
export function countMrsOfPd(lkey: number): number {
  const out = execFileSync('rdma', ['-j', '-d', 'resource', 'show', 'mr'], { encoding: 'utf8', timeout: 30_000 })
  const rows = (JSON.parse(out || '[]') as Array<{ pid?: number; lkey?: number | string; rkey?: number | string; pdn?: number }>).filter((row) => row.pid === process.pid)
  // iproute2 prints the keys as hex without 0x ("f5e").
  const key = (value: number | string | undefined): number => typeof value === 'string' ? parseInt(value, 16) : value ?? -1
  const pdn = rows.find((row) => key(row.lkey) === lkey)?.pdn
  if (pdn === undefined) throw new Error(`rdma resource show mr lists no region with lkey ${lkey} (${JSON.stringify(rows.slice(0, 3))})`)
  return rows.filter((row) => row.pdn === pdn).length
}

export function countAll(): Record<'qp' | 'cq' | 'pd' | 'mr' | 'contexts', number> {
  return { qp: countResources('qp'), cq: countResources('cq'), pd: countResources('pd'), mr: countResources('mr'), contexts: openDeviceFiles() }
}

/** Open device contexts: file descriptors of /dev/infiniband/uverbs*. */
export function openDeviceFiles(): number {
  let n = 0
  for (const fd of readdirSync('/proc/self/fd')) {
    try { if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('/dev/infiniband/uverbs')) n++ } catch { /* closed meanwhile */ }
  }
  return n
}

/**
 * Puts librdmacm's own PD of the device in one known state before a count:
 * allocated and kept. librdmacm allocates it for the first rdma_cm id bound to
 * a device and frees it only when its last id goes while no Device holds the
 * context (a Device holds a librdmacm reference until it is closed, so that a
 * DEVICE_REMOVAL can let the device go), so whether it is there after a run
 * depends on the order the run closed things. A leak check calls this before
 * both of its counts: a PD of the library's own still shows as one more.
 */
export async function keepLibrdmacmPd(host: string): Promise<void> {
  const { listen, openDevice } = await import('../../dist/index.js')
  const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
  try {
    ;(await listen({ host, port: 0 })).close()
  } finally {
    device.close()
  }
}
