// Loads the addon and describes its surface. The native layer is thin: it
// owns handles and the hot post/poll paths; validation happens in TypeScript.
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import { RdmaError } from '../core/errors.js'

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
/**
 * postOne(): post(0, 1, 1) for a buffer that holds one request at word 0
 * (SEND_POSTER_ONE_POLL), the count of its poll left in the CQ's count word;
 * or post(0, 1, 0) (SEND_POSTER_ONE). No argument to read, nothing returned.
 */
export type PostOneFunction = () => void
/** sendPoster()'s kinds (native/hot/hot_path.h, SendPosterKind): the single request at word 0, without and with a poll after. */
export const SEND_POSTER_ONE = 1
export const SEND_POSTER_ONE_POLL = 2
export interface NativeCompletionQueue {
  readonly entries: number
  /** The kernel handle (CQ_ERR events name the CQ by it). */
  readonly handle: number
  poll(): number
  /**
   * A plain function bound to this CQ that does what poll() does, without
   * unwrapping the object on each call; with `toCountWord`, it returns
   * nothing and the count is in the output's last word.
   */
  poller(): () => number
  poller(toCountWord: true): () => void
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
  // Word buffers (here, postRecv and the CQ's output) are any Uint32Array: the addon
  // reads them through napi_get_typedarray_info (native/hot/work_request.cc, Uint32Words),
  // which serves one over a SharedArrayBuffer too. The library passes its own.
  postSend(words: Uint32Array, count: number): void
  /** A plain post function bound to this QP, `words` (kept alive) and the CQ it polls after posting. */
  sendPoster(words: Uint32Array, cq?: NativeCompletionQueue): PostFunction
  sendPoster(words: Uint32Array, cq: NativeCompletionQueue, kind: typeof SEND_POSTER_ONE | typeof SEND_POSTER_ONE_POLL): PostOneFunction
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
  setAckTimeout(exponent: number): void
  connect(privateData: Uint8Array<ArrayBuffer> | undefined, responderResources: number, initiatorDepth: number, retryCount: number, rnrRetryCount: number): void
  accept(privateData: Uint8Array<ArrayBuffer> | undefined, responderResources: number, initiatorDepth: number, retryCount: number, rnrRetryCount: number): void
  reject(privateData: Uint8Array<ArrayBuffer> | undefined): void
  disconnect(): void
  deviceName(): string | null
  /** false while the port the id is bound to is not ACTIVE */
  portActive(): boolean
  localAddress(): NativeAddress | null
  peerAddress(): NativeAddress | null
  close(): void
}

export interface NativeAddon {
  listDevices(): NativeDeviceInfo[]
  /** Lets librdmacm close the contexts of removed devices nothing holds any more (rdma_get_devices + rdma_free_devices). */
  releaseRemovedDevices(): void
  /** type -1: the device's async fd failed; detail is then the errno and code its name. */
  setAsyncEventHandler(handler: (device: string, type: number, detail: number, code?: string) => void): void
  CmEventChannel: new (onEvent: (event: NativeCmEvent) => void) => NativeCmEventChannel
  CmId: new (channel: NativeCmEventChannel) => NativeCmId
  Context: new (name: string) => NativeContext
  ProtectionDomain: new (context: NativeContext) => NativeProtectionDomain
  NativeBuffer: new (size: number) => NativeBufferHandle
  MemoryRegion: {
    /**
     * JS memory must be an ArrayBuffer or a view over one: the addon reads its bytes
     * through napi_get_arraybuffer_info (native/core/common.cc, ArgBytes), which refuses
     * a view over a SharedArrayBuffer with an uncoded "Invalid argument".
     */
    new (pd: NativeProtectionDomain, memory: NativeBufferHandle | ArrayBuffer | ArrayBufferView<ArrayBuffer>, access: number): NativeMemoryRegion
    /** A dma-buf range (ibv_reg_dmabuf_mr, looked up at run time). */
    new (pd: NativeProtectionDomain, dmabufFd: number, access: number, offset: number, length: number, iova: number): NativeMemoryRegion
  }
  /** sysconf(_SC_PAGESIZE) */
  pageSize: number
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

const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..') // dist/native/ -> the package

// Layout constants of native/hot/work_request.h and native/core/resources.h. They are known
// without the addon (the encoders are pure); load() checks that the addon
// agrees, so a stale build fails with a clear error, not with corrupt requests.
export const COMPLETION_WORDS = 16
export const SEND_HEADER_WORDS = 16
export const RECV_HEADER_WORDS = 4

/** Packages that provide what a source build needs, per distribution family. */
export const BUILD_PACKAGES =
  '  Debian/Ubuntu: apt-get install libibverbs-dev librdmacm-dev pkg-config python3 make g++\n' +
  '  RHEL/Fedora:   dnf install rdma-core-devel pkgconf-pkg-config python3 make gcc-c++\n' +
  '  Alpine:        apk add rdma-core-dev pkgconf python3 make g++ linux-headers'

function loadFailure(cause: unknown): RdmaError {
  const reason = cause instanceof Error ? cause.message : String(cause)
  return new RdmaError(
    `node-ibverbs: could not load the native addon (${reason}).\n` +
      'Possible fixes:\n' +
      '- install rdma-core\'s runtime libraries: apt-get install libibverbs1 librdmacm1 ibverbs-providers\n' +
      '  (RHEL/Fedora: dnf install rdma-core libibverbs librdmacm; Alpine: apk add rdma-core)\n' +
      '- no prebuilt binary matches this platform: build from source with the development packages,\n' +
      BUILD_PACKAGES + '\n' +
      '  then npm rebuild node-ibverbs',
    { code: 'ERR_ADDON_LOAD', cause },
  )
}

function load(): NativeAddon {
  const require = createRequire(import.meta.url)
  let addon: NativeAddon
  try {
    // NODE_IBVERBS_ADDON names another build of the addon to load (scripts/test-asan.mjs
    // points it at the sanitizer build, so the normal build/Release stays untouched).
    const override = process.env.NODE_IBVERBS_ADDON
    addon = (override ? require(override) : require('node-gyp-build')(packageRoot)) as NativeAddon
  } catch (cause) {
    throw loadFailure(cause)
  }
  if (addon.completionWords !== COMPLETION_WORDS || addon.sendHeaderWords !== SEND_HEADER_WORDS ||
      addon.recvHeaderWords !== RECV_HEADER_WORDS) {
    throw loadFailure(new Error('the binary was built from other sources than this package\'s JavaScript (layout constants differ)'))
  }
  return addon
}

// The addon loads on first use, never at import: importing the package works
// everywhere, and isAvailable()/loadError() tell a service whether RDMA can
// be used at all. A failed load is remembered and thrown again on each use.
let loaded: NativeAddon | undefined
let failure: RdmaError | undefined
const onLoad: Array<(addon: NativeAddon) => void> = []

/** The addon, loaded now if it was not yet. Throws the load error (code ERR_ADDON_LOAD). */
export function addon(): NativeAddon {
  if (loaded) return loaded
  if (failure) throw failure
  try {
    loaded = load()
  } catch (error) {
    failure = error instanceof RdmaError ? error : loadFailure(error)
    throw failure
  }
  for (const hook of onLoad) hook(loaded)
  return loaded
}

/** Runs hook with the addon once it is loaded (now, if it already is). */
export function whenLoaded(hook: (addon: NativeAddon) => void): void {
  if (loaded) hook(loaded)
  else onLoad.push(hook)
}

/**
 * The addon, reached lazily: each property access loads it on first use.
 * Only constructors and setup calls go through here, never the per-operation
 * paths (those call methods of the handles the constructors returned).
 */
export const native: NativeAddon = new Proxy({} as NativeAddon, {
  get: (_target, key) => Reflect.get(addon(), key),
})

/**
 * Whether the native addon loads here (a prebuilt or locally built binary
 * matching this platform, and rdma-core's runtime libraries). Loads it if it
 * was not yet. Says nothing about RDMA devices: see listDevices().
 */
export function isAvailable(): boolean {
  return loadError() === null
}

/** Why the native addon does not load here (code ERR_ADDON_LOAD), or null when it does. */
export function loadError(): RdmaError | null {
  try {
    addon()
    return null
  } catch (error) {
    return error as RdmaError
  }
}
