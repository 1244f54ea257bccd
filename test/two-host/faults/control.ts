// A TCP control channel between the two guests (on their own wire
// addresses): the fault tests use it to agree on phases, to say which fault
// comes next and to compare checksums, out of band of the RDMA traffic under
// test. TCP survives the faults (netem loss, a short link flap) by itself.
import { createServer, connect as tcpConnect, type Socket } from 'node:net'

export interface Control {
  /** Sends one JSON message. */
  send(message: Record<string, unknown>): void
  /** The next message, which must have `type` (bounded: rejects after `ms`). */
  expect(type: string, ms?: number): Promise<Record<string, unknown>>
  close(): void
}

/** Host 0 listens on `local:port`, host 1 connects to `peer:port` (retrying while host 0 starts). */
export async function openControl(role: string, local: string, peer: string, port: number, ms = 120_000): Promise<Control> {
  const socket = role === '0' ? await acceptOne(local, port, ms) : await connectRetrying(peer, port, ms)
  socket.setNoDelay(true)
  const queue: Array<Record<string, unknown>> = []
  const waiters: Array<() => void> = []
  let buffered = ''
  let ended: Error | undefined
  socket.setEncoding('utf8')
  socket.on('data', (chunk: string) => {
    buffered += chunk
    for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
      queue.push(JSON.parse(buffered.slice(0, nl)) as Record<string, unknown>)
      buffered = buffered.slice(nl + 1)
    }
    waiters.splice(0).forEach((wake) => wake())
  })
  const end = (error: Error) => { ended ??= error; waiters.splice(0).forEach((wake) => wake()) }
  socket.on('error', end)
  socket.on('close', () => end(new Error('control channel closed by the peer')))
  return {
    send: (message) => { socket.write(`${JSON.stringify(message)}\n`) },
    async expect(type, wait = 120_000) {
      const deadline = Date.now() + wait
      for (;;) {
        const message = queue.shift()
        if (message) {
          if (message.type !== type) throw new Error(`control: expected '${type}', got ${JSON.stringify(message)}`)
          return message
        }
        if (ended) throw ended
        const left = deadline - Date.now()
        if (left <= 0) throw new Error(`control: no '${type}' from the peer within ${wait} ms`)
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, left)
          waiters.push(() => { clearTimeout(timer); resolve() })
        })
      }
    },
    close: () => socket.destroy(),
  }
}

function acceptOne(host: string, port: number, ms: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    const timer = setTimeout(() => { server.close(); reject(new Error(`control: nobody connected to ${host}:${port} within ${ms} ms`)) }, ms)
    server.once('connection', (socket) => { clearTimeout(timer); server.close(); resolve(socket) })
    server.once('error', (error) => { clearTimeout(timer); reject(error) })
    server.listen(port, host)
  })
}

async function connectRetrying(host: string, port: number, ms: number): Promise<Socket> {
  const deadline = Date.now() + ms
  for (;;) {
    try {
      return await new Promise<Socket>((resolve, reject) => {
        const socket = tcpConnect({ host, port })
        socket.once('connect', () => { socket.removeAllListeners('error'); resolve(socket) })
        socket.once('error', reject)
      })
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`control: cannot reach ${host}:${port} within ${ms} ms: ${(error as Error).message}`)
      await new Promise((resolve) => setTimeout(resolve, 300))
    }
  }
}
