// A TypeScript service that depends on node-ibverbs as an npm package.
// test/unit/78.consumer-install.test.ts installs the packed tarball next to
// it and type-checks it under --strict; test/rdma/97.consumer.test.ts runs it
// with a Soft-RoCE device, where it moves bytes and checks every one.
//   node consumer.js probe      -> {"available":..,"error":..} (no device needed)
//   node consumer.js transfer   -> WRITE, READ and SEND/RECV between two QPs, verified
import { Access, isAvailable, loadError, openDevice, remoteRegion, RdmaError } from 'node-ibverbs'
import type { MemoryRegion, QueuePair, RemoteDescriptor } from 'node-ibverbs'

const SIZE = 256 * 1024

function probe(): void {
  // A service checks this at start and falls back to TCP when it is false.
  const error: RdmaError | null = loadError()
  console.log(JSON.stringify({ available: isAvailable(), error: error ? error.code : null }))
}

interface Endpoint { qp: QueuePair; region: MemoryRegion }

async function transfer(): Promise<void> {
  const device = openDevice(process.env.SOFTROCE_DEVICE)
  const endpoint = (): Endpoint => {
    const pd = device.allocPd()
    const cq = device.createCq({ entries: 64 })
    const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 16, maxRecvWr: 16 })
    const region = pd.allocRegion(SIZE, Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead)
    return { qp, region }
  }
  const a = endpoint()
  const b = endpoint()
  await a.qp.connect(b.qp.endpoint())
  await b.qp.connect(a.qp.endpoint())
  // Descriptors travel as JSON, as they would between two machines.
  const descriptor: RemoteDescriptor = JSON.parse(JSON.stringify(b.region.describe()))
  const remote = remoteRegion(descriptor)

  const half = SIZE / 2
  const pattern = Uint8Array.from({ length: half }, (_, i) => (i * 131 + 17) & 0xff)
  a.region.bytes.set(pattern, 0)
  await a.qp.write(a.region.slice(0, half), remote.slice(half, half), { timeoutMs: 10_000 })
  const wrote = Buffer.compare(b.region.bytes.subarray(half, SIZE), pattern) === 0
  await a.qp.read(a.region.slice(half, half), remote.slice(half, half), { timeoutMs: 10_000 })
  const readBack = Buffer.compare(a.region.bytes.subarray(half, SIZE), pattern) === 0
  const message = Buffer.from('node-ibverbs consumer: hello over RDMA')
  const received = b.qp.recv(b.region.slice(0, 1024), { timeoutMs: 10_000 })
  a.region.bytes.set(message, 0)
  await a.qp.send(a.region.slice(0, message.length), { timeoutMs: 10_000 })
  const completion = await received
  const sent = completion.byteLength === message.length && Buffer.compare(b.region.bytes.subarray(0, message.length), message) === 0
  device.close()
  console.log(JSON.stringify({ device: device.name, wrote, readBack, sent, bytes: 2 * half + message.length }))
  if (!wrote || !readBack || !sent) process.exitCode = 1
}

const command = process.argv[2]
if (command === 'probe') probe()
else if (command === 'transfer') await transfer()
else {
  console.error('usage: node consumer.js probe|transfer')
  process.exitCode = 2
}
