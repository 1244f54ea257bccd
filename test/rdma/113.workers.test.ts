// Worker threads: each loads its own instance of the addon. Four move
// verified data at the same time; a worker terminated with requests in
// flight takes its native resources with it (the addon's environment
// cleanup hook), counted by the kernel (`rdma resource show`) and in fds.
import { describe, expect, it } from 'vitest'
import { Worker } from 'node:worker_threads'
import { fileURLToPath } from 'node:url'
import { readdirSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { testDevice, within } from './helpers.js'

const script = fileURLToPath(new URL('./fixtures/verbs-worker.mjs', import.meta.url))

function start(workerData: Record<string, unknown>): Worker {
  return new Worker(script, { workerData })
}

function message<T>(worker: Worker, ms = 120_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`worker: no message after ${ms} ms`)), ms)
    worker.once('message', (m) => { clearTimeout(timer); resolve(m as T) })
    worker.once('error', (e) => { clearTimeout(timer); reject(e) })
    worker.once('exit', (code) => { clearTimeout(timer); reject(new Error(`worker exited (${code}) before its message`)) })
  })
}

const fds = () => readdirSync('/proc/self/fd').length


/**
 * The kernel's objects on every RDMA device, whoever owns them: the kernel
 * names an object's owner by the creating thread's id, and a worker's thread
 * (and its id) is gone once it is terminated, so counting by pid would miss them.
 */
function countAll(): Record<'qp' | 'cq' | 'pd' | 'mr', number> {
  const count = (kind: string) => (JSON.parse(execFileSync('rdma', ['-j', 'resource', 'show', kind], { encoding: 'utf8', timeout: 30_000 }) || '[]') as unknown[]).length
  return { qp: count('qp'), cq: count('cq'), pd: count('pd'), mr: count('mr') }
}

/** Polls until `read()` equals `want` (cleanup after terminate() runs on the worker's thread, soon after). */
async function settlesTo<T>(read: () => T, want: T, ms = 30_000): Promise<T> {
  const end = Date.now() + ms
  let now = read()
  while (JSON.stringify(now) !== JSON.stringify(want) && Date.now() < end) {
    await new Promise((resolve) => setTimeout(resolve, 100))
    now = read()
  }
  return now
}

describe('worker threads', () => {
  it('four workers move verified data at once, then leave nothing behind', async () => {
    // librdmacm opens each device's context once per process, on first use, and keeps
    // it (2 fds): open it here first, or a worker's first use counts as a leak.
    testDevice().close()
    const before = countAll()
    const fdsBefore = fds()
    const workers = [0, 1, 2, 3].map(() => start({ mode: 'verify', rounds: 20 }))
    // Listened for from the start: a worker may exit while the others are still
    // reporting (its 'exit' was missed when listened for after all reports, and
    // the wait below then timed out: this test's failure after 112, never a hang).
    const exits = workers.map((w) => new Promise((resolve) => w.once('exit', resolve)))
    // A worker still alive 10 s after its report says what holds its loop.
    const alive = workers.map(() => undefined as unknown)
    workers.forEach((w, i) => w.on('message', (m: { stillAlive?: unknown }) => { if (m.stillAlive) alive[i] = m.stillAlive }))
    const results = await Promise.all(workers.map((w) => message<{ ok: boolean; bytes: number }>(w)))
    // Bounded: a worker that reported and closed everything must also exit (its loop empty).
    await Promise.all(exits.map((exited, i) => within(exited, 60_000, `worker ${i} exiting after its report`)
      .catch((error: Error) => { throw new Error(`${error.message}; its loop held ${JSON.stringify(alive[i]) ?? 'nothing it reported'}`) })))
    for (const r of results) expect(r).toMatchObject({ ok: true, bytes: expect.any(Number) })
    expect(results.every((r) => r.bytes > 0)).toBe(true)
    expect(await settlesTo(countAll, before)).toEqual(before)
    expect(await settlesTo(fds, fdsBefore)).toBe(fdsBefore)
  }, 300_000)

  it('terminating workers with requests in flight neither crashes nor leaks handles', async () => {
    const before = countAll()
    const fdsBefore = fds()
    const workers = [0, 1].map(() => start({ mode: 'inflight' }))
    const busy = await Promise.all(workers.map((w) => message<{ busy: number }>(w)))
    for (const b of busy) expect(b.busy).toBeGreaterThan(64) // receives and writes outstanding
    const during = countAll()
    expect(during.qp - before.qp).toBe(4) // the workers really hold resources the kernel sees
    const codes = await Promise.all(workers.map((w) => w.terminate()))
    expect(codes).toEqual([1, 1])
    expect(await settlesTo(countAll, before)).toEqual(before)
    expect(await settlesTo(fds, fdsBefore)).toBe(fdsBefore)
    // The process is fine: a new worker works.
    const again = start({ mode: 'verify', rounds: 9 })
    expect(await message(again)).toMatchObject({ ok: true })
  }, 300_000)
})
