// The faults themselves (netem on the guest's netdev, a link flap) and what
// the fault tests measure: the kernel's RDMA object counts, open fds, checksums.
import { execFileSync, spawn } from 'node:child_process'
import type { AsyncEvent, Device } from '../../../dist/index.js'
import { createHash } from 'node:crypto'
import { readdirSync } from 'node:fs'

export const NETDEV = process.env.SOFTROCE_NETDEV || 'eth0'

/**
 * Puts `netem` with these arguments (e.g. ['loss', '5%']) on this guest's egress; the module loads on first use.
 * netem's own queue holds 1000 packets unless told otherwise: a READ response of a few MiB overflows it
 * in one burst, rxe then fails to send and trips a 6.1 requester bug (docs/reliability.md, "RC READ
 * under loss"). The faults here are the wire's, so the queue is made large enough not to drop.
 */
export function netem(args: string[]): void {
  const limit = args.includes('limit') ? [] : ['limit', '100000']
  execFileSync('tc', ['qdisc', 'replace', 'dev', NETDEV, 'root', 'netem', ...args, ...limit], { stdio: 'pipe', timeout: 30_000 })
}

/** Removes any qdisc netem() put there (no error if there was none). */
export function clearNetem(): void {
  try { execFileSync('tc', ['qdisc', 'del', 'dev', NETDEV, 'root'], { stdio: 'pipe', timeout: 30_000 }) } catch { /* nothing to remove */ }
}

/** What tc says is on the netdev now (for the report). */
export function qdiscShown(): string {
  return execFileSync('tc', ['qdisc', 'show', 'dev', NETDEV], { encoding: 'utf8', timeout: 30_000 }).trim()
}

export function setLink(state: 'up' | 'down'): void {
  execFileSync('ip', ['link', 'set', NETDEV, state], { stdio: 'pipe', timeout: 30_000 })
}

/**
 * Takes this host's link down for `downMs` (calling `whileDown` once the port is
 * down), then up: returns the device's
 * async events meanwhile, with when PORT_ERR and PORT_ACTIVE came (ms from the start).
 */
export async function flapLink(device: Device, downMs: number, whileDown?: () => void | Promise<void>): Promise<{ events: Array<{ type: string; ms: number }>; errAt: number; activeAt: number }> {
  const events: Array<{ type: string; ms: number }> = []
  const start = performance.now()
  const onEvent = (event: AsyncEvent) => events.push({ type: event.type, ms: performance.now() - start })
  device.on('async', onEvent)
  try {
    setLink('down')
    const errAt = await waitFor(events, 'PORT_ERR', 30_000)
    await whileDown?.()
    await new Promise((resolve) => setTimeout(resolve, downMs))
    setLink('up')
    const activeAt = await waitFor(events, 'PORT_ACTIVE', 60_000)
    restoreAddresses()
    return { events, errAt, activeAt }
  } finally {
    device.off('async', onEvent)
  }
}

async function waitFor(events: Array<{ type: string; ms: number }>, type: string, ms: number): Promise<number> {
  const deadline = Date.now() + ms
  for (;;) {
    const found = events.find((e) => e.type === type)
    if (found) return found.ms
    if (Date.now() > deadline) throw new Error(`no ${type} event within ${ms} ms (saw ${events.map((e) => e.type).join(', ') || 'none'})`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** A link taken down loses its IPv6 address: put back what guest-setup.sh gave it. */
function restoreAddresses(): void {
  const addr6 = process.env.SOFTROCE_ADDR6
  if (!addr6) return
  try { spawn('ip', ['-6', 'addr', 'replace', `${addr6}/64`, 'dev', NETDEV, 'nodad'], { stdio: 'ignore' }) } catch { /* best effort */ }
}

/** What the wire and rdma_cm look like from this host: for a failure's message. */
export function wireState(peerAddress: string): string {
  const sh = (cmd: string, args: string[]) => { try { return execFileSync(cmd, args, { encoding: 'utf8', timeout: 10_000 }).trim() } catch (e) { return `(${(e as Error).message.split('\n')[0]})` } }
  return [
    `neigh: ${sh('ip', ['neigh', 'show', 'dev', NETDEV])}`,
    `route: ${sh('ip', ['route', 'get', peerAddress])}`,
    `link: ${sh('ip', ['-br', 'link', 'show', NETDEV])} ${sh('ip', ['-br', 'addr', 'show', NETDEV])}`,
    `QP1: ${sh('rdma', ['res', 'show', 'qp', 'lqpn', '1'])}`,
    `rxe: ${sh('rdma', ['statistic', 'show'])}`,
    `cm_ids: ${sh('rdma', ['res', 'show', 'cm_id'])}`,
    `dmesg: ${sh('dmesg', []).split('\n').slice(-15).join('\n  ')}`,
  ].join('\n')
}

export type Kind = 'qp' | 'cq' | 'pd' | 'mr' | 'cm_id'
export type Counts = Record<Kind | 'fds', number>

/** The kernel's RDMA objects of process `pid` (`rdma resource show`), and its open fds. */
export function counts(pid = process.pid): Counts {
  const kinds: Kind[] = ['qp', 'cq', 'pd', 'mr', 'cm_id']
  const out = Object.fromEntries(kinds.map((kind) => {
    const text = execFileSync('rdma', ['-j', 'resource', 'show', kind], { encoding: 'utf8', timeout: 30_000 })
    const rows = JSON.parse(text || '[]') as Array<{ pid?: number }>
    return [kind, rows.filter((row) => row.pid === pid).length]
  })) as Record<Kind, number>
  let fds = 0
  try { fds = readdirSync(`/proc/${pid}/fd`).length } catch { /* the process is gone */ }
  return { ...out, fds }
}

/**
 * The counts in `now`, with fds clamped to the baseline when they did not grow:
 * kernel RDMA objects must come back exactly, while a process's fd count also
 * moves with Node's own handles (fewer fds than at the baseline is not a leak).
 * Compare the result with `baseline` to see every object that leaked.
 */
export function leakView(now: Counts, baseline: Counts): Counts {
  return { ...now, fds: now.fds <= baseline.fds ? baseline.fds : now.fds }
}

/** Whether two plain values (counts, results) are equal, field by field in order. */
export const same = (a: unknown, b: unknown): boolean => JSON.stringify(a) === JSON.stringify(b)

export function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex')
}

export interface Settled { ok: boolean; code?: string; ms: number }

/** Records how and when `promise` settled (never rejects). */
export function track(promise: Promise<unknown>): Promise<Settled> {
  const start = performance.now()
  return promise.then(
    () => ({ ok: true, ms: performance.now() - start }),
    (error: { code?: string; message?: string }) => ({ ok: false, code: error.code ?? error.message ?? String(error), ms: performance.now() - start }),
  )
}

/** A line the campaign runner (scripts/faults.mjs) collects into the table of docs/reliability.md. */
export function figure(row: Record<string, unknown>): void {
  console.log(`FAULT-FIGURE ${JSON.stringify({ host: process.env.SOFTROCE_HOST_INDEX, ...row })}`)
}
