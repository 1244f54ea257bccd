// The options, events and addresses of rdma_cm connections and listeners.
import type { WaitOptions } from '../core/validate.js'
import type { RdmaError } from '../core/errors.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import type { CompletionQueue, CompletionQueueOptions } from '../verbs/completion-queue.js'
import type { QueuePair } from '../verbs/queue-pair.js'
import type { ConnectionRequest } from './listener.js'

export interface QpCaps { maxSendWr?: number; maxRecvWr?: number; maxSendSge?: number; maxRecvSge?: number; maxInlineData?: number }

/** Resources of a connection. Without `pd`, the connection opens its device and PD itself (and closes them). */
export interface ConnectionSetup {
  /**
   * Protection domain (of the device that serves the address) whose memory the connection will use.
   * Several (one per device, e.g. an agent's rails): the one of the device the address resolved to
   * (ERR_WRONG_DEVICE if none is); `connection.pd` says which.
   */
  pd?: ProtectionDomain | readonly ProtectionDomain[]
  /** A completion queue to share; default: one of the connection's own. */
  cq?: CompletionQueue
  cqOptions?: CompletionQueueOptions
  qp?: QpCaps
  /** Outstanding RDMA READ/atomic operations as responder / initiator (default: 16 or the device's limit). */
  responderResources?: number
  initiatorDepth?: number
  /** Post a receive for receiveJson() before the connection is established (so the peer may send at once). */
  receiveJson?: boolean
  /**
   * The QP's local ACK timeout, as the exponent of 4.096 µs · 2^ackTimeout (0-31; 14 is 67 ms): how
   * long a request waits for its acknowledgement or READ response before it is sent again. Default:
   * what rdma_cm derives from the path; on RoCE Linux gives 19, 2.1 s per retransmission, which makes
   * every packet lost on the wire cost 2.1 s (docs/reliability.md). Not negotiated with the peer.
   */
  ackTimeout?: number
}

export interface ConnectionOptions extends ConnectionSetup, WaitOptions {
  host: string
  port: number
  /** Up to 56 bytes the listener sees with the request (RC over IB/RoCE). */
  privateData?: Uint8Array<ArrayBuffer>
  /** Bound on address and route resolution and connection (default 10000 ms). */
  timeoutMs?: number
  /** Called with the new QP (state INIT) before rdma_connect: post receives here so the peer may send at once. */
  beforeConnect?: (qp: QueuePair) => void
}

/** Options of request.accept(). */
export interface AcceptOptions extends ConnectionSetup, WaitOptions {
  /** Up to 196 bytes the connecting side gets as connection.privateData. */
  privateData?: Uint8Array<ArrayBuffer>
  /** Called with the new QP (state INIT) before rdma_accept: post receives here so the peer may send at once. */
  beforeAccept?: (qp: QueuePair) => void
}

/** Options of request.reject(). */
export interface RejectOptions {
  /** Up to 148 bytes the connecting side gets as error.privateData. */
  privateData?: Uint8Array<ArrayBuffer>
}

/** An IP address and port of an rdma_cm id (local or peer). */
export interface CmAddress { address: string; port: number; family: 'IPv4' | 'IPv6' }

/** Connection events and their listeners' arguments. */
export interface ConnectionEvents {
  /** The peer disconnected, or the device went away; requests in flight fail with ECONNRESET. */
  disconnected: [reason: 'DISCONNECTED' | 'DEVICE_REMOVAL']
}

/** Listener events and their listeners' arguments. */
export interface ListenerEvents {
  /** A connection request; while any 'request' listener exists, requests go to it rather than to accept() / iteration. */
  request: [request: ConnectionRequest]
  /** Closed: by close() (no error), or by itself when its device was removed (an RdmaError, code ERR_DEVICE_REMOVED). */
  closed: [error: RdmaError | undefined]
}

export interface ListenOptions {
  host: string
  /** 0 picks a free port: see listener.address. */
  port: number
  backlog?: number
  /** Default PD for accepted connections. */
  pd?: ProtectionDomain
}
