// A segment's memory on the TCP transport: plain process memory, no device,
// no registration. The receiving agent's code enforces the rights and bounds
// (tcp/serve.ts); `key` names it on the wire as an rkey would.
import { isSharedArrayBuffer, NativeMemory, registerableBytes, type RegisterableMemory } from '../verbs/memory.js'
import { typeError, type WaitOptions } from '../core/validate.js'
import type { SegmentRights } from './segments.js'

export class PlainMemory {
  readonly #bytes: Uint8Array
  #open = true
  readonly #onClose: (memory: PlainMemory) => void

  /** @internal */
  constructor(bytes: Uint8Array, readonly key: number, readonly rights: SegmentRights,
    /** Reachable only by the links it is granted on (register's `peers`). */
    readonly perPeer: boolean, onClose: (memory: PlainMemory) => void) {
    this.#bytes = bytes
    this.#onClose = onClose
  }

  get length(): number { return this.#bytes.byteLength }
  /** The segment's bytes (the memory given to register(), or new zeroed memory). */
  get bytes(): Uint8Array { return this.#bytes }
  /** Whether peers can still reach it (false once unregistered). */
  get open(): boolean { return this.#open }
  /** @internal no device address: 0 */
  get address(): number { return 0 }
  /** @internal no local key: 0 */
  get lkey(): number { return 0 }
  /** @internal the wire form: the key stands where an rkey would */
  describe(): { addr: string; rkey: number } { return { addr: '0x0', rkey: this.key } }

  /** @internal withdrawn at once: nothing the device holds waits for it. */
  deregisterWhenIdle(_options?: WaitOptions): Promise<void> {
    this.close()
    return Promise.resolve()
  }

  /** @internal */
  close(): void {
    if (!this.#open) return
    this.#open = false
    this.#onClose(this)
  }
}

/** A view of the memory register({ memory }) was given (one view, no copy). */
export function plainBytes(memory: RegisterableMemory): Uint8Array {
  if (memory instanceof NativeMemory) return memory.bytes
  // Checked as a region's memory is (verbs/memory.ts): the same memory is refused the same way on either transport.
  if (memory instanceof ArrayBuffer || ArrayBuffer.isView(memory) || isSharedArrayBuffer(memory)) return registerableBytes(memory, 'options.memory')
  throw typeError('an ArrayBuffer, a typed array, a Buffer or NativeMemory', 'options.memory', memory)
}
