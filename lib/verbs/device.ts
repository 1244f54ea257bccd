// Devices: listing, opening, queries, and device async events.
import { EventEmitter } from 'node:events'
import { native, whenLoaded, type NativeContext } from '../native/addon.js'
import { call, errnoName, RdmaError } from '../core/errors.js'
import type { ErrnoCode, RdmaErrorCode } from '../core/error-codes.js'
import { Resource } from '../core/resource.js'
import { integer, typeError } from '../core/validate.js'
import { ProtectionDomain } from './protection-domain.js'
import { CompletionQueue, type CompletionQueueOptions } from './completion-queue.js'
import type { QueuePair } from './queue-pair.js'
import type { SharedReceiveQueue } from './shared-receive-queue.js'
import type { MemoryWindow } from './memory-window.js'

/** A device as listDevices() reports it. */
export interface DeviceInfo { name: string; guid: string; nodeType: string; transport: string }

export interface PortInfo {
  port: number
  /** 'DOWN', 'INIT', 'ARMED', 'ACTIVE', ... */
  state: string
  stateCode: number
  maxMtu: number
  activeMtu: number
  gidTableLength: number
  portCapFlags: number
  maxMessageSize: number
  lid: number
  smLid: number
  lmc: number
  linkLayer: 'Ethernet' | 'InfiniBand' | 'unspecified'
  activeWidth: number
  activeSpeed: number
  physState: number
}

export interface GidEntry { index: number; gid: string; type: 'IB' | 'RoCEv1' | 'RoCEv2' | 'unknown'; netdev: string | null }

export interface DeviceAttributes {
  name: string
  firmwareVersion: string
  nodeGuid: string
  sysImageGuid: string
  maxMrSize: bigint
  vendorId: number
  vendorPartId: number
  maxQp: number
  maxQpWr: number
  maxSge: number
  maxCq: number
  maxCqe: number
  maxMr: number
  maxPd: number
  maxQpRdAtom: number
  maxQpInitRdAtom: number
  atomicCap: 'none' | 'hca' | 'global'
  maxMw: number
  maxAh: number
  maxSrq: number
  maxSrqWr: number
  physPortCount: number
  [key: string]: unknown
}

/** A device async event, e.g. { type: 'PORT_ACTIVE', port: 1 } or { type: 'QP_FATAL', qpn: 17 }. */
export interface AsyncEvent { type: string; port?: number; qpn?: number; qp?: QueuePair; srq?: SharedReceiveQueue }

/** Device events and their listeners' arguments: see device.on(). */
export interface DeviceEvents {
  /** A device async event (ibv_get_async_event). */
  async: [event: AsyncEvent]
  /** A CQ or the device failed; the requests waiting on it were rejected with the same error. */
  error: [error: RdmaError]
}

/** ibv_event_type names (IBV_EVENT_*), by value. */
const ASYNC_EVENTS = [
  'CQ_ERR', 'QP_FATAL', 'QP_REQ_ERR', 'QP_ACCESS_ERR', 'COMM_EST', 'SQ_DRAINED', 'PATH_MIG', 'PATH_MIG_ERR',
  'DEVICE_FATAL', 'PORT_ACTIVE', 'PORT_ERR', 'LID_CHANGE', 'PKEY_CHANGE', 'SM_CHANGE', 'SRQ_ERR',
  'SRQ_LIMIT_REACHED', 'QP_LAST_WQE_REACHED', 'CLIENT_REREGISTER', 'GID_CHANGE', 'WQ_FATAL',
]
/** ibv_port_state names, by value. */
const PORT_STATES = ['NOP', 'DOWN', 'INIT', 'ARMED', 'ACTIVE', 'ACTIVE_DEFER']
const QP_EVENTS = new Set(['QP_FATAL', 'QP_REQ_ERR', 'QP_ACCESS_ERR', 'COMM_EST', 'SQ_DRAINED', 'PATH_MIG', 'PATH_MIG_ERR', 'QP_LAST_WQE_REACHED'])
const PORT_EVENTS = new Set(['PORT_ACTIVE', 'PORT_ERR', 'LID_CHANGE', 'PKEY_CHANGE', 'GID_CHANGE', 'SM_CHANGE', 'CLIENT_REREGISTER'])
// SRQ events name the SRQ by its kernel handle.
const QP_FAILURES = new Set(['QP_FATAL', 'QP_REQ_ERR', 'QP_ACCESS_ERR'])

/** The RDMA devices of this machine. */
export function listDevices(): DeviceInfo[] {
  return call(() => native.listDevices())
}

/** How to get a device where there is none: native Soft-RoCE first, a QEMU guest second. */
export const NO_DEVICES_HELP =
  'No RDMA devices on this machine. To get a software one (Soft-RoCE):\n' +
  '  - on a kernel with rdma_rxe (as root): modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>\n' +
  '    (or: npx node-ibverbs softroce up)\n' +
  '  - otherwise in a QEMU guest with Debian\'s kernel: npx node-ibverbs softroce run -- <command>\n' +
  'npx node-ibverbs devices shows what this machine has.'

/**
 * Opens a device by name, or without a name the first device with an ACTIVE
 * port. Throws an RdmaError with code 'ENODEV' naming the devices that exist;
 * its message tells "no devices" (how to get one) from "no ACTIVE port"
 * (each port's state and how to bring it up).
 */
export function openDevice(name?: string): Device {
  const devices = listDevices()
  if (name !== undefined && typeof name !== 'string') throw typeError('a device name', 'name', name)
  const names = devices.map((d) => d.name)
  const noDevice = (message: string) => Object.assign(new RdmaError(message, { code: 'ENODEV' }), { devices: names })
  if (names.length === 0) throw noDevice(NO_DEVICES_HELP)
  if (name !== undefined) {
    if (!names.includes(name)) throw noDevice(`No RDMA device named '${name}'; available: ${names.join(', ')}`)
    return new Device(name)
  }
  const states: string[] = []
  for (const candidate of names) {
    const device = new Device(candidate)
    try {
      const ports = device.query().physPortCount
      for (let port = 1; port <= ports; port++) {
        const state = device.queryPort(port).state
        if (state === 'ACTIVE') return device
        states.push(`${candidate} port ${port}: ${state}`)
      }
    } catch (error) {
      states.push(`${candidate}: ${(error as Error).message}`) // not usable: try the next one
    }
    device.close()
  }
  throw noDevice(`No RDMA device with an ACTIVE port (${states.join('; ')}). ` +
    'Bring the netdev under the port up (ip link set <netdev> up); npx node-ibverbs devices shows each port\'s state.')
}

// Memory windows by kernel device name. Every Device object opened on a device shares its
// rkeys: a LOCAL_INV posted through one reaches a window allocated through another.
const windowsByDevice = new Map<string, Set<WeakRef<MemoryWindow>>>()
function windowsOf(name: string): Set<WeakRef<MemoryWindow>> {
  let windows = windowsByDevice.get(name)
  if (windows === undefined) windowsByDevice.set(name, windows = new Set())
  return windows
}

export class Device extends Resource {
  protected readonly kind = 'Device'
  /** @internal */ readonly handle: NativeContext
  readonly name: string
  readonly #events = new EventEmitter()
  readonly #qps = new Map<number, WeakRef<QueuePair>>()
  readonly #srqs = new Map<number, WeakRef<SharedReceiveQueue>>()
  readonly #cqs = new Map<number, WeakRef<CompletionQueue>>()
  /**
   * Queue pairs a peer can reach (RTR and later), held strongly: one-sided
   * WRITEs, READs and atomics use a QP with no request of ours in flight, so
   * the GC must not take it (the peer's requests would hang). Closing it or
   * its error state lets it go; so does dropping the device itself.
   */
  readonly #reachableQps = new Set<QueuePair>()
  #attributes: DeviceAttributes | undefined

  /** Not constructible: made by openDevice(). */
  constructor(...notConstructible: never)
  /** @internal */
  constructor(name: string)
  constructor(name: string) {
    super()
    this.name = name
    this.handle = call(() => new native.Context(name))
    let devices = openDevices.get(name)
    if (!devices) openDevices.set(name, (devices = new Set()))
    devices.add(this.#self)
    call(() => this.handle.watchAsyncEvents())
  }

  readonly #self = new WeakRef<Device>(this)

  /** Device attributes (ibv_query_device). */
  query(): DeviceAttributes {
    this.assertOpen()
    this.#attributes ??= call(() => this.handle.query()) as DeviceAttributes
    return this.#attributes
  }

  /** Port attributes (ibv_query_port); ports are numbered from 1. */
  queryPort(port = 1): PortInfo {
    this.assertOpen()
    integer(port, 'port', 1, 255)
    const info = call(() => this.handle.queryPort(port)) as unknown as PortInfo
    info.state = PORT_STATES[info.stateCode] ?? `STATE_${info.stateCode}`
    return info
  }

  /** The port's GID table: index, GID, type and netdev of each entry. */
  gids(port = 1): GidEntry[] {
    this.assertOpen()
    integer(port, 'port', 1, 255)
    return call(() => this.handle.gids(port)) as GidEntry[]
  }

  /** The GID index connections use by default: RoCE v2 over IPv4 if there is one, else RoCE v2, else the first. */
  defaultGidIndex(port = 1): number {
    const gids = this.gids(port)
    const pick = gids.find((g) => g.type === 'RoCEv2' && g.gid.startsWith('::ffff:')) ?? gids.find((g) => g.type === 'RoCEv2') ?? gids[0]
    return pick?.index ?? 0
  }

  allocPd(): ProtectionDomain {
    this.assertOpen()
    return new ProtectionDomain(this)
  }

  createCq(options: CompletionQueueOptions = {}): CompletionQueue {
    this.assertOpen()
    return new CompletionQueue(this, options)
  }

  /**
   * Listens for device async events ('async', AsyncEvent) and failures
   * ('error': a CQ or the device failed; the requests waiting on it were
   * rejected with the same error).
   */
  on<E extends keyof DeviceEvents>(event: E, listener: (...args: DeviceEvents[E]) => void): this {
    this.#events.on(event, listener)
    return this
  }

  off<E extends keyof DeviceEvents>(event: E, listener: (...args: DeviceEvents[E]) => void): this {
    this.#events.off(event, listener)
    return this
  }

  /** @internal */
  emit<E extends keyof DeviceEvents>(event: E, ...args: DeviceEvents[E]): void {
    if (event === 'error' && this.#events.listenerCount('error') === 0) return
    this.#events.emit(event, ...args)
  }

  /** @internal */ trackQp(qp: QueuePair): void { this.#qps.set(qp.qpn, new WeakRef(qp)) }
  /** @internal */ untrackQp(qp: QueuePair): void { this.#qps.delete(qp.qpn); this.#reachableQps.delete(qp) }
  /** @internal Whether a peer can reach `qp` (see #reachableQps). */
  setQpReachable(qp: QueuePair, reachable: boolean): void {
    if (reachable) this.#reachableQps.add(qp)
    else this.#reachableQps.delete(qp)
  }
  /** @internal */ trackSrq(srq: SharedReceiveQueue): void { this.#srqs.set(srq.kernelHandle, new WeakRef(srq)) }
  /** @internal */ untrackSrq(srq: SharedReceiveQueue): void { this.#srqs.delete(srq.kernelHandle) }
  /** @internal */ trackCq(cq: CompletionQueue): void { this.#cqs.set(cq.kernelHandle, new WeakRef(cq)) }
  /** @internal */ untrackCq(cq: CompletionQueue): void { this.#cqs.delete(cq.kernelHandle) }
  /** @internal */ trackWindow(ref: WeakRef<MemoryWindow>): void { windowsOf(this.name).add(ref) }
  /** @internal */ untrackWindow(ref: WeakRef<MemoryWindow>): void { windowsOf(this.name).delete(ref) }

  /**
   * @internal The open memory window of this process on this kernel device
   * (through any Device object: the rkey space is the kernel device's) whose
   * current rkey is `rkey`, if any (not a hot path).
   */
  windowWithRkey(rkey: number): MemoryWindow | undefined {
    const windows = windowsOf(this.name)
    for (const ref of windows) {
      const window = ref.deref()
      if (window === undefined) windows.delete(ref)
      else if (!window.closed && window.rkey === rkey) return window
    }
    return undefined
  }

  /**
   * @internal The device can deliver nothing more (DEVICE_FATAL, or its async
   * fd failed): every request waiting on one of its CQs fails with `error`,
   * then 'error' is emitted.
   */
  failAll(error: RdmaError): void {
    for (const ref of [...this.#cqs.values()]) ref.deref()?.failAll(error, false)
    this.emit('error', error)
  }

  /** @internal */
  onAsyncEvent(type: number, detail: number): void {
    if (this.closed) return
    const name = ASYNC_EVENTS[type] ?? `EVENT_${type}`
    const event: AsyncEvent = { type: name }
    if (PORT_EVENTS.has(name)) event.port = detail
    if (QP_EVENTS.has(name)) {
      event.qpn = detail
      const qp = this.#qps.get(detail)?.deref()
      if (qp) {
        event.qp = qp
        if (QP_FAILURES.has(name)) qp.failed(new RdmaError(`QP ${detail}: ${name}`, { code: name as RdmaErrorCode, qpn: detail }))
      }
    }
    if (name === 'SRQ_ERR' || name === 'SRQ_LIMIT_REACHED') {
      const srq = this.#srqs.get(detail)?.deref()
      if (srq) event.srq = srq
    }
    if (name === 'CQ_ERR') {
      const cq = this.#cqs.get(detail)?.deref()
      cq?.failAll(new RdmaError(`CompletionQueue ${detail}: CQ_ERR (overrun or a device error)`, { code: 'CQ_ERR' }))
    }
    if (name === 'DEVICE_FATAL') this.failAll(new RdmaError(`Device ${this.name}: DEVICE_FATAL`, { code: 'DEVICE_FATAL' }))
    this.#events.emit('async', event)
  }

  /** @internal The device's async fd failed (the device went away): nothing more will come. */
  onAsyncFailure(errno: number, code: ErrnoCode): void {
    if (this.closed) return
    this.failAll(new RdmaError(`Device ${this.name} failed: ibv_get_async_event: ${code}`, { code, errno, syscall: 'ibv_get_async_event' }))
  }

  protected override afterClose(): void {
    openDevices.get(this.name)?.delete(this.#self)
  }

  protected closeHandle(): void {
    call(() => this.handle.close())
  }
}

// Every open Device per device name: a device's async events go to each.
const openDevices = new Map<string, Set<WeakRef<Device>>>()
// Each listener runs in turn; one may close any Device (each checks that it is
// still open), so the set is copied first.
// Installed when the addon loads (on first use, not at import).
whenLoaded((addon) => addon.setAsyncEventHandler((name, type, detail, code) => {
  for (const ref of [...(openDevices.get(name) ?? [])]) {
    const device = ref.deref()
    if (type < 0) device?.onAsyncFailure(detail, (code as ErrnoCode | undefined) ?? errnoName(detail))
    else device?.onAsyncEvent(type, detail)
  }
}))
