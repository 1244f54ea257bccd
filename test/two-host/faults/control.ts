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
  /**
   * A barrier: both sides call it with the same `tag`; messages left over
   * from a step that failed on one side are dropped on the way, so one
   * failed step does not put every later one out of step.
   */
  sync(tag: string, ms?: number): Promise<void>
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
  /** The next message, waiting until `deadline` (`what` names it in the error). */
  async function next(deadline: number, what: string, wait: number): Promise<Record<string, unknown>> {
    for (;;) {
      const message = queue.shift()
      if (message) return message
      if (ended) throw ended
      const left = deadline - Date.now()
      if (left <= 0) throw new Error(`control: ${what} within ${wait} ms`)
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left)
        waiters.push(() => { clearTimeout(timer); resolve() })
      })
    }
  }
  return {
    send: (message) => { socket.write(`${JSON.stringify(message)}\n`) },
    async expect(type, wait = 120_000) {
      const message = await next(Date.now() + wait, `no '${type}' from the peer`, wait)
      if (message.type !== type) {
        if (message.type === SYNC) queue.unshift(message) // the peer is at a barrier: leave it for sync()
        throw new Error(`control: expected '${type}', got ${JSON.stringify(message)}`)
      }
      return message
    },
    async sync(tag, wait = 120_000) {
      socket.write(`${JSON.stringify({ type: SYNC, tag })}\n`)
      const deadline = Date.now() + wait
      // Messages before the peer's barrier are left over from a step that failed on one side.
      for (;;) {
        const message = await next(deadline, `the peer did not reach '${tag}'`, wait)
        if (message.type === SYNC && message.tag === tag) return
      }
    },
    close: () => socket.destroy(),
  }
}

const SYNC = 'sync'

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
