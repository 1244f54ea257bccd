// The baseline of the TCP transport's bench: a plain node:net socket on
// loopback moving the same bytes, the same way round (the blocks' bytes
// written as views of the source, no copy; the receiver copying each chunk
// once into its memory, at the blocks' offsets), timed until the receiver
// says it has every byte (a 1-byte answer: the engine's transfer resolves on
// the peer's ack too). What the engine adds over this is its frames, its
// checks and its acks per batch.
import { createServer, connect, type AddressInfo, type Socket } from 'node:net'
import { performance } from 'node:perf_hooks'

/** `cpuSeconds`: user + system CPU of this process (both ends) while it ran. */
export interface NetCopyResult { kind: 'net'; bytes: number; seconds: number; mbPerSec: number; cpuSeconds: number }

const MB = 1 << 20

/** Writes `blockSize` bytes at each of `localOffsets` of `source`, `repeat` times; the receiver places them at `remoteOffsets` of `target`. */
export async function plainNetCopy(source: Uint8Array, target: Uint8Array, localOffsets: Float64Array, remoteOffsets: Float64Array, blockSize: number, repeat = 1): Promise<NetCopyResult> {
  const total = localOffsets.length * blockSize
  let receiver: Socket | undefined
  const server = createServer((socket) => {
    receiver = socket
    socket.setNoDelay(true)
    let block = 0
    let within = 0
    let got = 0
    socket.on('data', (chunk: Buffer) => {
      let at = 0
      while (at < chunk.length) {
        const take = Math.min(blockSize - within, chunk.length - at)
        target.set(chunk.subarray(at, at + take), remoteOffsets[block]! + within)
        within += take
        at += take
        if (within === blockSize) { within = 0; block++ }
      }
      got += chunk.length
      if (got === total) { got = 0; block = 0; socket.write(Buffer.of(1)) }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const client = connect({ host: '127.0.0.1', port: (server.address() as AddressInfo).port })
  client.setNoDelay(true)
  await new Promise((resolve) => client.once('connect', resolve))
  try {
    const cpu0 = process.cpuUsage()
    const t0 = performance.now()
    for (let r = 0; r < repeat; r++) {
      const done = new Promise((resolve) => client.once('data', resolve))
      client.cork()
      for (let i = 0; i < localOffsets.length; i++) client.write(source.subarray(localOffsets[i]!, localOffsets[i]! + blockSize))
      client.uncork()
      await done
    }
    const seconds = (performance.now() - t0) / 1000
    const cpu = process.cpuUsage(cpu0)
    return { kind: 'net', bytes: total, seconds, mbPerSec: (total * repeat) / seconds / MB, cpuSeconds: (cpu.user + cpu.system) / 1e6 }
  } finally {
    client.destroy()
    receiver?.destroy()
    server.close()
  }
}
