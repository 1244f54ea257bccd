#!/usr/bin/env node
// A private etcd (Debian's etcd-server) for tests and examples: client and
// peer URLs on free ports of 127.0.0.1 (inside the QEMU guest that is the
// guest's own loopback), a data dir on a tmpfs (on the guest's 9p root bbolt's
// mmap fails and etcd panics), stopped and removed at the end, or when the
// process exits.
//
//   import { startEtcd } from '../../scripts/etcd-server.mjs'
//   const etcd = await startEtcd()      // etcd.endpoint: 'http://127.0.0.1:<port>'
//   await startEtcd({ host: '198.19.0.1', clientPort: 7491, peerPort: 7492 })  // reachable from another guest
//   await etcd.kill()                   // SIGKILL, like a crash
//   await etcd.start({ fresh: true })   // again on the same ports (fresh: an empty data dir)
//   await etcd.stop()                   // killed, data dir removed
//
// As a command: `node scripts/etcd-server.mjs` prints the endpoint and runs
// until it gets SIGINT/SIGTERM or its stdin closes.
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, mkdirSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { request } from 'node:http'
import { fileURLToPath } from 'node:url'

const live = new Set()
let exitHookSet = false

/** The etcd binary (ETCD_BIN, else `etcd` on PATH), or undefined when it is not installed. */
export function etcdBinary() {
  const bin = process.env.ETCD_BIN || 'etcd'
  const found = spawnSync(bin, ['--version'], { encoding: 'utf8' })
  return found.status === 0 ? bin : undefined
}

/** A directory on a tmpfs: /dev/shm or /run (bbolt needs a shared mmap the 9p root cannot give). */
function tmpfsDir() {
  let mounts = ''
  try { mounts = readFileSync('/proc/mounts', 'utf8') } catch { /* not Linux */ }
  const tmpfs = new Set(mounts.split('\n').map((line) => line.split(' ')).filter((f) => f[2] === 'tmpfs').map((f) => f[1]))
  for (const candidate of ['/dev/shm', '/run']) {
    if (!tmpfs.has(candidate)) continue
    try {
      mkdirSync(join(candidate, 'node-ibverbs-etcd'), { recursive: true })
      return mkdtempSync(join(candidate, 'node-ibverbs-etcd', 'data-'))
    } catch { /* not writable: the next one */ }
  }
  return mkdtempSync(join(tmpdir(), 'node-ibverbs-etcd-'))
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
}

function healthy(port, host = '127.0.0.1') {
  return new Promise((resolve) => {
    const req = request({ host, port, path: '/health', timeout: 1000 }, (res) => {
      let body = ''
      res.on('data', (chunk) => { body += chunk })
      res.on('end', () => resolve(body.includes('"health":"true"')))
    })
    req.on('error', () => resolve(false))
    req.on('timeout', () => { req.destroy(); resolve(false) })
    req.end()
  })
}

export class EtcdServer {
  /** @param {{ bin: string, host?: string, clientPort: number, peerPort: number, dataDir: string, timeoutMs: number }} o */
  constructor(o) {
    this.bin = o.bin
    this.host = o.host ?? '127.0.0.1'
    this.clientPort = o.clientPort
    this.peerPort = o.peerPort
    this.dataDir = o.dataDir
    this.timeoutMs = o.timeoutMs
    this.endpoint = `http://${this.host}:${o.clientPort}`
    /** @type {import('node:child_process').ChildProcess | undefined} */
    this.process = undefined
    this.log = ''
  }

  get pid() { return this.process?.pid }
  get running() { return this.process !== undefined && this.process.exitCode === null && this.process.signalCode === null }

  /** Starts etcd (again) on the same ports; `fresh` empties the data dir first (etcd came back without its data). */
  async start({ fresh = false } = {}) {
    if (this.running) throw new Error('etcd is running already')
    if (fresh) {
      rmSync(this.dataDir, { recursive: true, force: true })
      mkdirSync(this.dataDir, { recursive: true })
    }
    const peer = `http://${this.host}:${this.peerPort}`
    const child = spawn(this.bin, [
      '--name', 'n0', '--data-dir', this.dataDir,
      '--listen-client-urls', this.endpoint, '--advertise-client-urls', this.endpoint,
      '--listen-peer-urls', peer, '--initial-advertise-peer-urls', peer, '--initial-cluster', `n0=${peer}`,
      '--logger', 'zap', '--log-outputs', 'stderr', '--log-level', process.env.ETCD_LOG ? 'info' : 'warn',
    ], { stdio: ['ignore', 'ignore', 'pipe'] })
    this.process = child
    live.add(this)
    child.stderr.setEncoding('utf8')
    child.stderr.on('data', (chunk) => {
      if (process.env.ETCD_LOG) process.stderr.write(chunk)
      this.log = (this.log + chunk).slice(-8192)
    })
    const deadline = Date.now() + this.timeoutMs
    while (!(await healthy(this.clientPort, this.host))) {
      if (child.exitCode !== null || child.signalCode !== null) throw new Error(`etcd exited (${child.exitCode ?? child.signalCode}) before it was healthy:\n${this.log}`)
      if (Date.now() > deadline) {
        await this.kill()
        throw new Error(`etcd was not healthy within ${this.timeoutMs} ms:\n${this.log}`)
      }
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    return this
  }

  /** Sends `signal` (default SIGKILL: a crash) and waits for the exit (a stopped process is resumed to die). */
  kill(signal = 'SIGKILL') {
    const child = this.process
    if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
    return new Promise((resolve) => {
      child.once('exit', () => resolve())
      child.kill(signal)
      if (signal !== 'SIGKILL') setTimeout(() => child.kill('SIGKILL'), 10_000).unref()
    })
  }

  /**
   * Freezes etcd (SIGSTOP): its sockets stay open and nothing answers, as
   * behind a partition. Resolves once the kernel shows it stopped (a signal
   * is delivered asynchronously: a request sent at once could still be served).
   */
  async pause() {
    const pid = this.process?.pid
    if (pid === undefined) return
    this.process.kill('SIGSTOP')
    const deadline = Date.now() + 10_000
    // /proc/<pid>/stat: "pid (comm) S ..."; T = stopped.
    while (!/\) T /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'))) {
      if (Date.now() > deadline) throw new Error(`etcd (pid ${pid}) did not stop within 10 s`)
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
  }

  resume() { this.process?.kill('SIGCONT') }

  /** Kills etcd and removes its data dir. */
  async stop() {
    await this.kill()
    live.delete(this)
    rmSync(this.dataDir, { recursive: true, force: true })
  }
}

/**
 * Starts a one-member etcd on free ports of 127.0.0.1 with a data dir on a
 * tmpfs, and waits until it answers /health (within timeoutMs). `host`: an
 * address of this machine to serve on instead (another guest's agents can
 * reach it); `clientPort`, `peerPort`: fixed ports instead of free ones (the
 * other guest must know them).
 * @param {{ bin?: string, timeoutMs?: number, host?: string, clientPort?: number, peerPort?: number }} [options]
 * @returns {Promise<EtcdServer>}
 */
export async function startEtcd(options = {}) {
  const bin = options.bin ?? process.env.ETCD_BIN ?? 'etcd'
  if (!exitHookSet) {
    exitHookSet = true
    // A test that crashes must not leave an etcd behind.
    process.once('exit', () => {
      for (const server of live) {
        try { server.process?.kill('SIGKILL') } catch { /* gone */ }
        rmSync(server.dataDir, { recursive: true, force: true })
      }
    })
  }
  let lastError
  for (let attempt = 0; attempt < 3; attempt++) { // a port taken between freePort() and etcd's bind: other ports
    const server = new EtcdServer({ bin, host: options.host, clientPort: options.clientPort ?? await freePort(), peerPort: options.peerPort ?? await freePort(), dataDir: tmpfsDir(), timeoutMs: options.timeoutMs ?? 60_000 })
    try {
      return await server.start()
    } catch (error) {
      lastError = error
      await server.stop()
      if (!/address already in use/.test(server.log) || options.clientPort !== undefined) break
    }
  }
  throw lastError
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const server = await startEtcd()
  console.log(`etcd ${server.endpoint} (pid ${server.pid}, data ${server.dataDir})`)
  const stop = () => server.stop().then(() => process.exit(0))
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
  process.stdin.on('end', stop)
  process.stdin.resume()
}
