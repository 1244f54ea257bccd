// Loads the addon and describes its surface. The native layer is thin: it
// owns handles and the hot post/poll paths; validation happens in TypeScript.
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'

export interface NativeDeviceInfo { name: string; guid: string; nodeType: string; transport: string }

export interface NativeContext {
  query(): Record<string, unknown>
  queryPort(port: number): Record<string, unknown>
  gids(port: number): Array<{ index: number; gid: string; type: string; netdev: string | null }>
  readonly name: string
  /** Starts delivering this device's async events to setAsyncEventHandler's handler. */
  watchAsyncEvents(): void
  close(): void
}
export interface NativeProtectionDomain { readonly handle: number; close(): void }
export interface NativeBufferHandle { readonly address: number; readonly size: number; view(offset?: number, length?: number): ArrayBuffer; release(): void }
export interface NativeMemoryRegion {
  info(): { address: number; length: number; lkey: number; rkey: number }
  isDetached(): boolean
  close(): void
}
/** post(wordStart, count, poll): posts `count` encoded send WRs from wordStart of the bound buffer; with poll 1, polls the CQ once after and returns what it polled. */
export type PostFunction = (wordStart: number, count: number, poll: number) => number
export interface NativeCompletionQueue {
  readonly entries: number
  /** The kernel handle (CQ_ERR events name the CQ by it). */
  readonly handle: number
  poll(): number
  /** A plain function bound to this CQ that does what poll() does, without unwrapping the object on each call. */
  poller(): () => number
  setWaiting(waiting: boolean): void
  setRearm(rearm: boolean): void
  /** Test hook: handles the channel as if polling its fd had failed. */
  simulateFdError(): void
  close(): void
}
export interface NativeQpCaps { maxSendWr: number; maxRecvWr: number; maxSendSge: number; maxRecvSge: number; maxInlineData: number }
export interface NativeQueuePair {
  readonly qpn: number
  readonly caps: NativeQpCaps
  modify(attrs: Record<string, unknown>): void
  query(): Record<string, unknown>
  postSend(words: Uint32Array, count: number): void
  /** A plain post function bound to this QP, `words` (kept alive) and the CQ it polls after posting. */
  sendPoster(words: Uint32Array, cq?: NativeCompletionQueue): PostFunction
  postRecv(words: Uint32Array, count: number): void
  bindMemoryWindow(mw: NativeMemoryWindow, mr: NativeMemoryRegion, address: number, length: number,
    access: number, wrIdLo: number, wrIdHi: number, sendFlags: number): number
  close(): void
}
export interface NativeSharedReceiveQueue {
  readonly handle: number
  postRecv(words: Uint32Array, count: number): void
  arm(limit: number): void
  query(): { maxWr: number; maxSge: number; limit: number }
  close(): void
}
export interface NativeAddressHandle { readonly id: number; close(): void }
export interface NativeMemoryWindow { readonly rkey: number; readonly type: number; setRkey(rkey: number): void; close(): void }

export interface NativeCmEvent {
  type: string
  status: number
  key: number
  listenKey: number
  privateData?: Buffer
  responderResources: number
  initiatorDepth: number
  /** The new id of a CONNECT_REQUEST. */
  id?: NativeCmId
}
export interface NativeAddress { address: string; port: number; family: 'IPv4' | 'IPv6' }
export interface NativeCmEventChannel { setWaiting(waiting: boolean): void; close(): void }
export interface NativeCmId {
  readonly key: number
  bind(host: string, port: number): void
  listen(backlog: number): void
  resolveAddr(host: string, port: number, timeoutMs: number): void
  resolveRoute(timeoutMs: number): void
  createQp(pd: NativeProtectionDomain, options: Record<string, unknown>): NativeQueuePair
  connect(privateData: Uint8Array | undefined, responderResources: number, initiatorDepth: number, retryCount: number, rnrRetryCount: number): void
  accept(privateData: Uint8Array | undefined, responderResources: number, initiatorDepth: number, retryCount: number, rnrRetryCount: number): void
  reject(privateData: Uint8Array | undefined): void
  disconnect(): void
  deviceName(): string | null
  localAddress(): NativeAddress | null
  peerAddress(): NativeAddress | null
  close(): void
}

export interface NativeAddon {
  listDevices(): NativeDeviceInfo[]
  /** type -1: the device's async fd failed; detail is then the errno and code its name. */
  setAsyncEventHandler(handler: (device: string, type: number, detail: number, code?: string) => void): void
  CmEventChannel: new (onEvent: (event: NativeCmEvent) => void) => NativeCmEventChannel
  CmId: new (channel: NativeCmEventChannel) => NativeCmId
  Context: new (name: string) => NativeContext
  ProtectionDomain: new (context: NativeContext) => NativeProtectionDomain
  NativeBuffer: new (size: number) => NativeBufferHandle
  MemoryRegion: new (pd: NativeProtectionDomain, memory: NativeBufferHandle | ArrayBuffer | ArrayBufferView, access: number) => NativeMemoryRegion
  CompletionQueue: new (context: NativeContext, entries: number, output: Uint32Array,
    onCompletions: (count: number, syscall?: string) => void, compVector: number) => NativeCompletionQueue
  QueuePair: new (pd: NativeProtectionDomain, options: Record<string, unknown>) => NativeQueuePair
  SharedReceiveQueue: new (pd: NativeProtectionDomain, maxWr: number, maxSge: number, limit: number) => NativeSharedReceiveQueue
  AddressHandle: new (pd: NativeProtectionDomain, attr: Record<string, unknown>) => NativeAddressHandle
  MemoryWindow: new (pd: NativeProtectionDomain, type: number) => NativeMemoryWindow
  /** Top-level resources (devices, rdma_cm channels) the addon's cleanup hook still tracks. */
  rootCount(): number
  /** ibv_is_fork_initialized() */
  forkStatus(): 'disabled' | 'enabled' | 'unneeded'
  /** ibv_fork_init(): throws with its errno */
  forkInit(): void
  completionWords: number
  sendHeaderWords: number
  recvHeaderWords: number
}

const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..')

function load(): NativeAddon {
  const require = createRequire(import.meta.url)
  try {
    // NODE_IBVERBS_ADDON names another build of the addon to load (scripts/test-asan.mjs
    // points it at the sanitizer build, so the normal build/Release stays untouched).
    const override = process.env.NODE_IBVERBS_ADDON
    return (override ? require(override) : require('node-gyp-build')(packageRoot)) as NativeAddon
  } catch (cause) {
    const reason = cause instanceof Error ? cause.message : String(cause)
    const error = new Error(
      `node-ibverbs: could not load the native addon (${reason}).\n` +
        'Possible fixes:\n' +
        '- install rdma-core\'s runtime libraries: apt-get install libibverbs1 librdmacm1 ibverbs-providers\n' +
        '- to build from source, install the development packages and a compiler:\n' +
        '  apt-get install libibverbs-dev librdmacm-dev pkg-config python3 make g++, then npm rebuild node-ibverbs',
      { cause },
    ) as Error & { code: string }
    error.code = 'ERR_ADDON_LOAD'
    throw error
  }
}

export const native: NativeAddon = load()
