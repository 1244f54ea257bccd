// JSON messages over a connection's QP: SEND/RECV of at most 4 KiB each,
// into receive slots posted ahead.
import { closedError } from '../core/errors.js'
import { tooLarge, type WaitOptions } from '../core/validate.js'
import { QueuePair } from '../verbs/queue-pair.js'
import { Access } from '../core/constants.js'
import type { MemoryRegion } from '../verbs/memory.js'
import { JSON_BYTES, aborted, bounded } from './channel.js'

interface JsonSlot { region: MemoryRegion; offset: number }
type Received = { value: unknown } | { error: unknown }
interface Receiver { resolve: (value: unknown) => void; reject: (error: unknown) => void }

/**
 * JSON messages over a connection's QP. Every message in flight has a 4 KiB
 * slot of its own (from regions that grow by doubling and are reused), held
 * until its work request completes, even when the caller gave up waiting: so
 * concurrent calls never touch bytes the device has not read or written yet.
 * Receives are posted one per waiting call; a message nobody waits for any
 * more (its call timed out) goes to the next call, none is lost.
 */
export class JsonMessages {
  readonly #qp: QueuePair
  readonly #regions: MemoryRegion[] = []
  readonly #free: JsonSlot[] = []
  readonly #inbox: Received[] = []
  readonly #receivers: Receiver[] = []
  #posted = 0
  #closed = false

  constructor(qp: QueuePair) { this.#qp = qp }

  async send(value: unknown, wait: WaitOptions): Promise<void> {
    if (this.#closed) throw closedError('Connection')
    const bytes = Buffer.from(JSON.stringify(value))
    if (bytes.length > JSON_BYTES) throw tooLarge(`JSON message of ${bytes.length} bytes is over ${JSON_BYTES}`)
    if (wait.signal?.aborted) throw aborted('sendJson', wait.signal)
    const slot = this.#take()
    const free = () => this.#give(slot)
    let sent: Promise<unknown>
    try {
      slot.region.bytes.set(bytes, slot.offset)
      sent = this.#qp.send(slot.region.slice(slot.offset, bytes.length))
    } catch (error) {
      free()
      throw error
    }
    sent.then(free, free) // the slot is reusable only once the device is done with it
    await bounded(sent, 'sendJson', wait)
  }

  receive(wait: WaitOptions): Promise<unknown> {
    if (this.#closed) return Promise.reject(closedError('Connection'))
    const ready = this.#inbox.shift()
    if (ready) return 'error' in ready ? Promise.reject(ready.error) : Promise.resolve(ready.value)
    if (wait.signal?.aborted) return Promise.reject(aborted('receiveJson', wait.signal))
    let receiver!: Receiver
    const received = new Promise<unknown>((resolve, reject) => { receiver = { resolve, reject } })
    this.#receivers.push(receiver)
    const gaveUp = (error: unknown) => {
      const index = this.#receivers.indexOf(receiver)
      if (index >= 0) this.#receivers.splice(index, 1) // its receive (if posted) stays posted for the next call
      throw error
    }
    try {
      if (this.#posted < this.#receivers.length) this.postReceive()
    } catch (error) {
      return Promise.reject(error).catch(gaveUp)
    }
    return bounded(received, 'receiveJson', wait).catch(gaveUp)
  }

  /** Posts one receive into a slot of its own; its message goes to the first waiting call, or the inbox. */
  postReceive(): void {
    const slot = this.#take()
    this.#posted++
    const settle = (result: Received) => {
      this.#posted--
      this.#give(slot)
      const receiver = this.#receivers.shift()
      if (!receiver) this.#inbox.push(result)
      else if ('error' in result) receiver.reject(result.error)
      else receiver.resolve(result.value)
    }
    this.#qp.recv(slot.region.slice(slot.offset, JSON_BYTES)).then((wc) => {
      let result: Received
      try {
        result = { value: JSON.parse(Buffer.from(slot.region.bytes.subarray(slot.offset, slot.offset + wc.byteLength)).toString()) }
      } catch (error) {
        result = { error }
      }
      settle(result)
    }, (error: unknown) => settle({ error }))
  }

  /** Call after the QP is closed (its requests released the slots' regions). */
  close(): void {
    this.#closed = true
    for (const region of this.#regions.splice(0)) region.close()
    this.#free.length = 0
  }

  #take(): JsonSlot {
    if (this.#free.length === 0) this.#grow()
    return this.#free.pop()!
  }

  #give(slot: JsonSlot): void {
    if (!this.#closed) this.#free.push(slot)
  }

  #grow(): void {
    const count = 2 ** (this.#regions.length + 1) // 2, 4, 8, ... slots: the total doubles
    const region = this.#qp.pd.allocRegion(count * JSON_BYTES, Access.LocalWrite)
    this.#regions.push(region)
    for (let i = count - 1; i >= 0; i--) this.#free.push({ region, offset: i * JSON_BYTES })
  }
}

/** Typed listener methods (the rest of EventEmitter is Node's). */
