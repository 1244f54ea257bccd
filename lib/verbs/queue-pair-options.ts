// The options and descriptors of queue pairs and their operations.
import { QpType, type QpTypeName } from '../core/constants.js'
import { integer } from '../core/validate.js'
import type { WaitOptions } from '../core/validate.js'
import type { CompletionQueue } from './completion-queue.js'
import type { SharedReceiveQueue } from './shared-receive-queue.js'
import type { AddressHandle } from './address-handle.js'
import type { LocalSlice } from './memory.js'
import type { RemoteSlice } from './remote.js'

export interface QueuePairOptions {
  type?: QpTypeName
  sendCq: CompletionQueue
  /** Defaults to sendCq. */
  recvCq?: CompletionQueue
  srq?: SharedReceiveQueue
  maxSendWr?: number
  maxRecvWr?: number
  maxSendSge?: number
  maxRecvSge?: number
  maxInlineData?: number
  /** Port used by connect() (default 1). */
  port?: number
  /** GID index for RoCE (default: the port's RoCE v2 IPv4 GID, else its first GID). */
  gidIndex?: number
}

/** What a peer needs to connect to this QP. JSON-safe; send it any way you like. */
export interface QpEndpoint {
  version: 1
  type: QpTypeName
  qpn: number
  psn: number
  lid: number
  gid: string
  gidIndex: number
  mtu: number
  port: number
}

/** Overrides for connect(); every verbs attribute of the transitions can be set. */
export interface ConnectOptions {
  accessFlags?: number
  pkeyIndex?: number
  mtu?: number
  sl?: number
  hopLimit?: number
  trafficClass?: number
  flowLabel?: number
  minRnrTimer?: number
  maxDestRdAtomic?: number
  maxRdAtomic?: number
  timeout?: number
  retryCount?: number
  rnrRetry?: number
}

export interface OpOptions extends WaitOptions {
  /** Post without a signaled completion is not offered for single operations: each promise needs one. */
  fence?: boolean
  solicited?: boolean
  /** Copy the data into the work request (size <= maxInlineData). */
  inline?: boolean
}

export interface SendOptions extends OpOptions {
  /** 32-bit immediate data delivered with the message (SEND_WITH_IMM). */
  immediate?: number
  /**
   * Rkey the receiver's device invalidates (SEND_WITH_INV): a type 2 window
   * the receiver has bound. The receiver's device cannot be checked from
   * here; Soft-RoCE on Linux 6.1 dereferences NULL in the receiver's kernel
   * for a window that is not bound (docs/api.md, `.invalidate()`).
   */
  invalidateRkey?: number
  /** UD destination. */
  dest?: { ah: AddressHandle; qpn: number; qkey: number }
}

export interface WriteOptions extends OpOptions {
  /** 32-bit immediate data: consumes a receive on the peer (WRITE_WITH_IMM). */
  immediate?: number
}

export interface AtomicOptions extends WaitOptions {
  /** Where the original value lands (8 bytes); default: library-owned scratch memory. */
  local?: LocalSlice
}

export type BatchOperation =
  | { op: 'write'; local: LocalSlice | readonly LocalSlice[]; remote: RemoteSlice; immediate?: number; inline?: boolean }
  | { op: 'read'; local: LocalSlice | readonly LocalSlice[]; remote: RemoteSlice }
  | { op: 'send'; local: LocalSlice | readonly LocalSlice[]; immediate?: number; inline?: boolean; dest?: SendOptions['dest'] }
  /** The value before the operation lands in `local` (8 bytes, little-endian as the device writes it). */
  | { op: 'compareAndSwap'; local: LocalSlice; remote: RemoteSlice; compare: bigint; swap: bigint }
  | { op: 'fetchAndAdd'; local: LocalSlice; remote: RemoteSlice; add: bigint }

export interface BatchOptions extends WaitOptions {
  /** 'last' (default): one signaled completion for the whole batch. 'each': one per work request. */
  completions?: 'last' | 'each'
}

/** The checked options of ibv_create_qp (the addon's QueuePair constructor). */
export function nativeQpOptions(o: Record<string, unknown>, type: QpTypeName, sendCq: CompletionQueue, recvCq: CompletionQueue,
  srq: SharedReceiveQueue | undefined): Record<string, unknown> {
  return {
    type: QpType[type],
    sendCq: sendCq.handle,
    recvCq: recvCq.handle,
    srq: srq?.handle,
    maxSendWr: integer(o.maxSendWr ?? 128, 'options.maxSendWr', 1, 1 << 20),
    maxRecvWr: integer(o.maxRecvWr ?? 128, 'options.maxRecvWr', 1, 1 << 20),
    maxSendSge: integer(o.maxSendSge ?? 1, 'options.maxSendSge', 1, 64),
    maxRecvSge: integer(o.maxRecvSge ?? 1, 'options.maxRecvSge', 1, 64),
    maxInlineData: integer(o.maxInlineData ?? 0, 'options.maxInlineData', 0, 1 << 16),
  }
}
