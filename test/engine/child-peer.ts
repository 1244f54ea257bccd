// A transfer agent in its own process (test/rdma/fixtures/transfer-peer.mjs)
// on the suite's transport: segment 'kv' (read-write, with a seed filled with
// pattern(size, seed)), checksums of its bytes on request; killed, frozen or
// stopped by the peer suites; its agent restarted on the same memory, or its
// links dropped, on request.
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { within, type EngineEnv } from './util.js'

export interface Child {
  process: ChildProcess
  port: number
  sum: (offset: number, length: number) => Promise<number>
  /** md5 (16 hex digits) of `count` blocks of `blockSize` bytes from `offset` of its segment. */
  hashes: (offset: number, blockSize: number, count: number) => Promise<string[]>
  /** Its agent closed and created again (a new incarnation) on the same port and the same memory. */
  restart: () => Promise<void>
  /** Every link of its agent closed (the agent stays). */
  drop: () => Promise<void>
  stop: () => Promise<void>
}

export function startChild(env: EngineEnv, options: { port?: number; size: number; seed?: number }): Promise<Child> {
  const script = fileURLToPath(new URL('../rdma/fixtures/transfer-peer.mjs', import.meta.url))
  const args = [script, env.host, String(options.port ?? 0), String(options.size), ...(options.seed !== undefined ? [String(options.seed)] : [])]
  const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'], env: { ...process.env, TRANSFER_TRANSPORT: env.transport } })
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
  return within(nextLine().then((line) => {
    const match = line.match(/^listening (\d+)/)
    if (!match) throw new Error(`child said: ${line}`)
    return {
      process: child,
      port: Number(match[1]),
      sum: async (offset: number, length: number) => {
        const reply = nextLine()
        child.stdin!.write(`sum ${offset} ${length}\n`)
        return Number((await within(reply, 30_000, 'the child\'s checksum')).split(' ')[1])
      },
      hashes: async (offset: number, blockSize: number, count: number) => {
        const reply = nextLine()
        child.stdin!.write(`hashes ${offset} ${blockSize} ${count}\n`)
        return (await within(reply, 300_000, 'the child\'s hashes')).split(' ')[1]!.split(',')
      },
      restart: async () => {
        const reply = nextLine()
        child.stdin!.write('restart\n')
        const line = await within(reply, 60_000, 'the child\'s agent to restart')
        if (line !== `listening ${match[1]}`) throw new Error(`child said: ${line}`)
      },
      drop: async () => {
        const reply = nextLine()
        child.stdin!.write('drop\n')
        await within(reply, 30_000, 'the child to drop its links')
      },
      stop: () => new Promise<void>((done) => {
        if (child.exitCode !== null || child.signalCode !== null) return done()
        child.once('exit', () => done())
        child.kill('SIGCONT')
        child.stdin!.end()
        setTimeout(() => child.kill('SIGKILL'), 10_000).unref()
      }),
    }
  }), 120_000, 'the child agent to start')
}
