// Starting the rdma_cm server fixture in its own process, and the client side
// of its protocol (see fixtures/cm-server.mjs).
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { connect, decodeDescriptors, remoteRegion, type Connection, type ProtectionDomain } from '../../dist/index.js'
import { pattern } from './helpers.js'

export interface ServerProcess { child: ChildProcess; port: number; stop: () => Promise<void> }

export function startServer(host: string, port = 0): Promise<ServerProcess> {
  const script = fileURLToPath(new URL('./fixtures/cm-server.mjs', import.meta.url))
  const child = spawn(process.execPath, [script, host, String(port)], { stdio: ['pipe', 'pipe', 'inherit'] })
  return new Promise((resolve, reject) => {
    let out = ''
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`server did not start: ${out}`)) }, 60_000)
    child.once('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited with ${code}: ${out}`)) })
    child.stdout!.on('data', (chunk) => {
      out += chunk
      const match = out.match(/listening (\d+)/)
      if (!match) return
      clearTimeout(timer)
      child.removeAllListeners('exit')
      const stop = () => new Promise<void>((done) => {
        if (child.exitCode !== null || child.signalCode !== null) return done()
        child.once('exit', () => done())
        child.stdin!.end()
        setTimeout(() => child.kill('SIGKILL'), 10_000).unref()
      })
      resolve({ child, port: Number(match[1]), stop })
    })
  })
}

/** Connects, writes a pattern into the server's region, reads it back, and has the server checksum what it received. */
export async function exchange(host: string, port: number, pd: ProtectionDomain, seed: number): Promise<Connection> {
  const conn = await connect({ host, port, pd, receiveJson: true, timeoutMs: 30_000 })
  const [descriptor] = decodeDescriptors(conn.privateData)
  const remote = remoteRegion(descriptor)
  const local = pd.allocRegion(8192)
  try {
    const data = pattern(4096, seed)
    local.bytes.set(data)
    await conn.qp.write(local.slice(0, 4096), remote.slice(1024, 4096))
    await conn.qp.read(local.slice(4096, 4096), remote.slice(1024, 4096))
    if (Buffer.compare(local.bytes.subarray(4096, 8192), data) !== 0) throw new Error('READ brought back other bytes than were written')
    await conn.sendJson({ sum: [1024, 4096] })
    const reply = (await conn.receiveJson()) as { sum: number }
    let sum = 0
    for (const byte of data) sum = (sum * 31 + byte) >>> 0
    if (reply.sum !== sum) throw new Error(`server saw checksum ${reply.sum}, expected ${sum}`)
    return conn
  } finally {
    local.deregister()
  }
}
