// fork() with registered memory. Node starts children through libuv
// (child_process.fork, spawn, exec): the child execs at once and spawn()
// returns after the exec. What must hold: the parent's registered memory
// stays the parent's (kernels >= 5.13 copy pinned pages into the child, and
// libibverbs says so: forkSupport() === 'unneeded'), RDMA traffic running
// across the forks keeps every byte, and a child inherits no RDMA file
// descriptor (libibverbs and the kernel open them close-on-exec).
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { execFile, fork } from 'node:child_process'
import { release } from 'node:os'
import { fileURLToPath } from 'node:url'
import { randomBytes, randomInt } from 'node:crypto'
import { enableForkSupport, forkSupport, type Device } from '../../dist/index.js'
import { connectedPair, testDevice } from './helpers.js'

let device: Device
beforeAll(() => { device = testDevice() })
afterAll(() => device?.close())

const child = fileURLToPath(new URL('./fixtures/fork-child.mjs', import.meta.url))
const bounded = { timeoutMs: 60_000 }
const [major, minor] = release().split('.').map(Number)
const kernelCopiesPinnedPages = major > 5 || (major === 5 && minor >= 13)

function shellFds(): Promise<string[]> {
  return new Promise((resolve, reject) => {
    // The shell's own descriptors, as it inherited them.
    execFile('sh', ['-c', 'for f in /proc/$$/fd/*; do readlink "$f"; done; true'], { timeout: 120_000 }, (error, stdout) => {
      if (error) reject(error)
      else resolve(stdout.split('\n').filter(Boolean))
    })
  })
}

function nodeChild(): Promise<{ inherited: string[]; ok: boolean }> {
  return new Promise((resolve, reject) => {
    const c = fork(child, [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'], timeout: 240_000 })
    let result: { inherited: string[]; ok: boolean } | undefined
    c.once('message', (m) => { result = m as typeof result })
    c.once('error', reject)
    c.once('exit', (code) => (code === 0 && result ? resolve(result) : reject(new Error(`fork-child exited ${code} without a result`))))
  })
}

describe('fork() with registered memory', () => {
  it(`libibverbs reports fork support ${kernelCopiesPinnedPages ? "'unneeded' (kernel >= 5.13)" : 'as disabled until enabled'}`, () => {
    if (kernelCopiesPinnedPages) {
      expect(forkSupport()).toBe('unneeded')
      // A no-op here, even with memory registered (where libibverbs itself would say EINVAL).
      device.allocPd().allocRegion(4096).pd.close()
      expect(enableForkSupport()).toBe('unneeded')
    } else {
      expect(['disabled', 'enabled']).toContain(forkSupport())
    }
  })

  it('spawned shells and forked Node children run while RDMA traffic flows: every byte arrives, no RDMA fd is inherited', async () => {
    const { a, b, close } = await connectedPair(device, { size: 1 << 20 })
    let stop = false
    let traffic: Promise<void> = Promise.resolve()
    try {
      let rounds = 0
      // Traffic: the parent writes with the CPU into registered pages, the
      // device reads them (RDMA write to b) and writes them back (RDMA read).
      traffic = (async () => {
        while (!stop) {
          const length = randomInt(1, 65537)
          const offset = randomInt(0, (1 << 19) - length)
          const data = randomBytes(length)
          a.region.bytes.set(data, offset)
          await a.qp.write(a.region.slice(offset, length), b.region.asRemote().slice(offset, length), bounded)
          expect(Buffer.compare(b.region.bytes.subarray(offset, offset + length), data)).toBe(0)
          await a.qp.read(a.region.slice((1 << 19) + offset, length), b.region.asRemote().slice(offset, length), bounded)
          expect(Buffer.compare(a.region.bytes.subarray((1 << 19) + offset, (1 << 19) + offset + length), data)).toBe(0)
          rounds++
        }
      })()
      traffic.catch(() => {}) // awaited below; a failure meanwhile is not an unhandled rejection
      const shells = await Promise.all(Array.from({ length: 4 }, () => shellFds()))
      const children = [await nodeChild()]
      stop = true
      await traffic
      expect(rounds).toBeGreaterThan(0)
      for (const fds of shells) expect(fds.filter((l) => l.includes('infiniband'))).toEqual([])
      for (const c of children) expect(c).toEqual({ inherited: [], ok: true })
      // After the children: a full pass over the region, both directions.
      const all = randomBytes(1 << 19)
      a.region.bytes.set(all, 0)
      await a.qp.write(a.region.slice(0, 1 << 19), b.region.asRemote().slice(0, 1 << 19), bounded)
      expect(Buffer.compare(b.region.bytes.subarray(0, 1 << 19), all)).toBe(0)
      b.region.bytes.set(randomBytes(1 << 19), 1 << 19)
      await a.qp.read(a.region.slice(1 << 19, 1 << 19), b.region.asRemote().slice(1 << 19, 1 << 19), bounded)
      expect(Buffer.compare(a.region.bytes.subarray(1 << 19), b.region.bytes.subarray(1 << 19))).toBe(0)
    } finally {
      stop = true
      await traffic.catch(() => {}) // its failure, if any, was reported above
      close()
    }
  }, 600_000)
})
