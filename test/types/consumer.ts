// A TypeScript service using node-ibverbs as a user would: it imports only the
// package entry (by name: the package's own `exports`, i.e. dist/index.d.ts).
// Never run: test/unit/90.public-types.test.ts type-checks it with tsc --strict.
// Every `@ts-expect-error` line is a misuse the types must refuse: if one stops
// being an error, tsc reports the unused directive and the test fails.
import {
  Access, connect, listen, listDevices, openDevice, remoteRegion, encodeDescriptors, decodeDescriptors,
  QpState, RdmaError, wcStatusNames, QueuePair, Connection, Listener, Device,
  type AcceptOptions, type AsyncEvent, type BatchOperation, type CmAddress, type CompletionQueueOptions,
  type ConnectionEvents, type ConnectionOptions, type DeviceEvents, type DeviceInfo, type LocalSlice,
  type MemoryRegion, type QpEndpoint, type QueuePairOptions, type RdmaErrorDetails, type ReceiveCompletion,
  type RegisterableMemory, type RemoteDescriptor, type Resource, type SharedReceiveQueueOptions, type WaitOptions,
} from 'node-ibverbs'
import type { DoctorCheck, DoctorReport, DoctorStatus } from 'node-ibverbs'

// @ts-expect-error only the package entry is exported, not its files
import type { NativeAddon } from 'node-ibverbs/dist/native/addon.js'

declare function sendToPeer(value: unknown): void
declare function fromPeer<T>(): Promise<T>

export async function loopback(): Promise<void> {
  const devices: DeviceInfo[] = listDevices()
  const device: Device = openDevice(devices[0]?.name)
  const pd = device.allocPd()
  const cqOptions: CompletionQueueOptions = { entries: 256, pollMode: 'busy' }
  const cq = device.createCq(cqOptions)
  const mr = pd.allocRegion(1 << 20, Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic)
  const options: QueuePairOptions = { type: 'RC', sendCq: cq, maxSendWr: 64 }
  const qp: QueuePair = pd.createQp(options)

  const endpoint: QpEndpoint = qp.endpoint()
  sendToPeer(endpoint)
  await qp.connect(await fromPeer<QpEndpoint>(), { retryCount: 7 })

  const descriptor: RemoteDescriptor = mr.describe()
  const remote = remoteRegion(JSON.parse(JSON.stringify(descriptor)))
  const wait: WaitOptions = { timeoutMs: 1000, signal: AbortSignal.timeout(2000) }
  await qp.write(mr.slice(0, 8), remote.slice(0, 8), { ...wait, immediate: 7 })
  await qp.read([mr.slice(8, 8), mr.slice(16, 8)], remote.slice(0, 16), wait)
  await qp.send([], { immediate: 1 })
  const received: ReceiveCompletion = await qp.recv(mr.slice(0, 4096), wait)
  const bytes: number = received.byteLength
  const old: bigint = await qp.fetchAndAdd(remote.slice(0, 8), 1n)
  const swapped: bigint = await qp.compareAndSwap(remote.slice(0, 8), old, old + 1n, { local: mr.slice(24, 8) })
  const batch: BatchOperation[] = [{ op: 'write', local: mr.slice(0, 8), remote: remote.slice(0, 8) }, { op: 'send', local: [] }]
  await qp.postBatch(batch, { completions: 'each' })
  const state: 'RTS' | 'ERR' | string = qp.state
  const resetValue: 0 = QpState.RESET
  const status: string | undefined = wcStatusNames[5]
  console.log(bytes, swapped, state, resetValue, status)

  const srqOptions: SharedReceiveQueueOptions = { maxWr: 128 }
  const srq = pd.createSrq(srqOptions)
  const slices: readonly LocalSlice[] = [mr.slice(0, 64), mr.slice(64, 64)]
  const fromSrq: ReceiveCompletion = await srq.recv(slices, { timeoutMs: 100 })
  console.log(fromSrq.qpn)

  const mw = pd.allocMemoryWindow(2)
  const grant = await qp.bindWindow(mw, mr.slice(0, 4096), Access.RemoteRead)
  await qp.invalidate(grant.rkey)

  const onAsync = (event: AsyncEvent): void => { if (event.type === 'PORT_ERR') console.log(event.port, event.qp?.qpn) }
  device.on('async', onAsync).on('error', (error) => { const code: string = error.code; console.log(code) })
  device.off('async', onAsync)
  const deviceEvent: DeviceEvents['error'] = [new RdmaError('x', { code: 'EIO' })]
  console.log(deviceEvent)

  // JS memory registers in place: an ArrayBuffer or any view over one, and the
  // bytes of library memory or of another region (ArrayBuffer-backed views).
  const memories: RegisterableMemory[] = [new ArrayBuffer(64), Buffer.alloc(64), Buffer.allocUnsafe(64).subarray(8),
    Buffer.from('text'), new Uint8Array(64), new Float64Array(8), new DataView(new ArrayBuffer(64), 8),
    pd.allocBuffer(64), pd.allocBuffer(64).bytes, mr.bytes, mr.slice(0, 64).bytes]
  const registered: MemoryRegion[] = memories.map((memory) => pd.registerMemory(memory, Access.LocalWrite))
  registered.push(pd.registerMemory(mr.bytes.subarray(0, 64)))

  // Every closable object is a Resource: close(), closed, Symbol.dispose.
  const resources: Resource[] = [...registered, qp, srq, mw, cq, mr, pd, device]
  for (const resource of resources) if (!resource.closed) resource.close()
  {
    using scoped = openDevice()
    console.log(scoped.name)
  }

  // --- misuse the types refuse ------------------------------------------
  // @ts-expect-error internal members are not in the public types
  qp.handle.postSend(new Uint32Array(16), 1)
  // @ts-expect-error internal members are not in the public types
  console.log(qp.pendings)
  // @ts-expect-error a region's count of requests in flight is read-only
  mr.inflight = 0
  // @ts-expect-error internal hooks are not in the public types
  device.trackQp(qp)
  // @ts-expect-error a QP needs a send CQ
  pd.createQp({ type: 'RC' })
  // @ts-expect-error no such QP type
  pd.createQp({ type: 'XRC', sendCq: cq })
  // @ts-expect-error a remote slice is not local memory
  await qp.write(remote.slice(0, 8), remote.slice(0, 8))
  // @ts-expect-error srq.recv takes local slices
  await srq.recv(remote.slice(0, 8))
  // @ts-expect-error srq.recv takes local slices, not raw bytes
  await srq.recv(new Uint8Array(8))
  // @ts-expect-error timeoutMs is a number
  await qp.send([], { timeoutMs: '100' })
  // @ts-expect-error atomics take bigints
  await qp.fetchAndAdd(remote.slice(0, 8), 1)
  // @ts-expect-error no such batch operation
  await qp.postBatch([{ op: 'atomic', local: mr.slice(0, 8) }])
  // @ts-expect-error no such device event
  device.on('disconnected', () => {})
  // @ts-expect-error 'async' listeners get an AsyncEvent
  device.on('async', (event: string) => console.log(event))
  // @ts-expect-error memory windows are type 1 or 2
  pd.allocMemoryWindow(3)
  // @ts-expect-error a view over a SharedArrayBuffer is not registerable memory (ERR_INVALID_ARG_TYPE at run time)
  pd.registerMemory(new Uint8Array(new SharedArrayBuffer(64)))
  // @ts-expect-error nor is a DataView over one
  pd.registerMemory(new DataView(new SharedArrayBuffer(64)))
  // @ts-expect-error nor a bare SharedArrayBuffer
  pd.registerMemory(new SharedArrayBuffer(64))
  // @ts-expect-error a view typed over ArrayBufferLike may be over a SharedArrayBuffer: narrow it first
  pd.registerMemory(new Uint8Array(64) as Uint8Array)
  // @ts-expect-error objects come from factories (openDevice(), pd.createQp(), ...), not constructors
  new Device()
  // @ts-expect-error objects come from factories, not constructors
  new QueuePair()
  // @ts-expect-error objects come from factories, not constructors
  new Connection()
  // @ts-expect-error objects come from factories, not constructors
  new Listener()
  // @ts-expect-error close() returns nothing to await on
  const closing: Promise<void> = qp.close()
  console.log(closing)
}

export async function connections(): Promise<void> {
  const listener: Listener = await listen({ host: '198.18.0.1', port: 0, backlog: 16 })
  const bound: CmAddress | null = listener.address
  console.log(bound?.port, bound?.family)
  listener.on('request', (request) => { request.reject({ privateData: new Uint8Array([1]) }) })
  listener.off('request', () => {})

  const accepting = (async () => {
    for await (const request of listener) {
      const options: AcceptOptions = { privateData: encodeDescriptors([{ addr: '0x1000', rkey: 1, length: 8 }]), receiveJson: true, timeoutMs: 5000 }
      const accepted: Connection = await request.accept(options)
      const from: CmAddress | null = request.remoteAddress
      console.log(from?.address, accepted.qp.qpn)
      // @ts-expect-error the rdma_cm id is internal
      console.log(request.id)
      return accepted
    }
    return undefined
  })()

  const connectOptions: ConnectionOptions = { host: '198.18.0.1', port: bound?.port ?? 7471, timeoutMs: 5000, beforeConnect: (qp) => console.log(qp.state) }
  try {
    const conn: Connection = await connect(connectOptions)
    const [theirs] = decodeDescriptors(conn.privateData)
    if (theirs) console.log(remoteRegion(theirs).length)
    conn.on('disconnected', (reason) => { const why: 'DISCONNECTED' | 'DEVICE_REMOVAL' = reason; console.log(why) })
    const onDisconnect = (...args: ConnectionEvents['disconnected']): void => console.log(args[0])
    conn.once('disconnected', onDisconnect).off('disconnected', onDisconnect)
    await conn.sendJson({ hello: 1 })
    const message: unknown = await conn.receiveJson({ timeoutMs: 1000 })
    console.log(message, conn.localAddress?.port, conn.remoteAddress?.address)
    // @ts-expect-error no such connection event
    conn.on('close', () => {})
    // @ts-expect-error 'disconnected' listeners get a reason string
    conn.on('disconnected', (reason: number) => console.log(reason))
    // @ts-expect-error a connection needs a port
    await connect({ host: '198.18.0.1' })
    // @ts-expect-error private data over a SharedArrayBuffer (ERR_INVALID_ARG_TYPE at run time)
    await connect({ host: '198.18.0.1', port: 7471, privateData: new Uint8Array(new SharedArrayBuffer(8)) })
    await conn.disconnect({ timeoutMs: 1000 })
  } catch (error) {
    if (error instanceof RdmaError) {
      const fields: [string, number | undefined, string | undefined, string[] | undefined, Buffer | undefined, number | undefined] =
        [error.code, error.errno, error.status, error.devices, error.privateData, error.cmStatus]
      console.log(fields, error.qpn, error.wrId, error.verb, error.posted, error.cause)
      const details: RdmaErrorDetails = { code: error.code, qpn: 1 }
      console.log(new RdmaError('copy', details))
      // @ts-expect-error RdmaError fields are read-only
      error.code = 'EIO'
    }
  }
  // @ts-expect-error no such listener event
  listener.on('connection', () => {})
  await accepting
  listener.close()
}

// `node-ibverbs doctor --json` parsed by a program: a check narrows on its id.
export function readDoctor(json: string): number | null {
  const report = JSON.parse(json) as DoctorReport
  const statuses: DoctorStatus[] = report.checks.map((c: DoctorCheck) => c.status)
  console.log(statuses, report.counts.fail, report.ok)
  for (const check of report.checks) {
    if (check.id === 'gid') return check.facts.index
    if (check.id === 'memlock') console.log(check.facts.limitBytes === 'unlimited' ? 'no limit' : check.facts.limitBytes)
    // @ts-expect-error a check's facts are its own: an rdma-cm check has no limitBytes
    if (check.id === 'rdma-cm') console.log(check.facts.limitBytes)
  }
  return null
}
