// Notifications: their wire form (control.ts's 'n' message) and the feed that
// hands arrived ones to every notifications() iterator.
import { tooLarge, typeError } from '../core/validate.js'
import { MAX_NOTIFICATION_BYTES, type NotifyMessage } from './control.js'
import type { Notification } from './agent-options.js'

function notificationTooLarge(bytes: number): Error {
  return tooLarge(`A notification holds at most ${MAX_NOTIFICATION_BYTES} bytes; this one has ${bytes}`)
}

/** A notification checked once at the call (at most MAX_NOTIFICATION_BYTES), as the transports send it. */
export interface NoticePayload {
  /** The string as given, for a string; undefined for bytes. */
  text: string | undefined
  /** Its UTF-8, or a copy of the bytes (the caller may reuse theirs at once). */
  bytes: Buffer
}

/** A string or bytes as a notification (refused above MAX_NOTIFICATION_BYTES). */
export function noticePayload(message: unknown): NoticePayload {
  if (typeof message === 'string') {
    const utf8 = Buffer.from(message)
    if (utf8.length > MAX_NOTIFICATION_BYTES) throw notificationTooLarge(utf8.length)
    return { text: message, bytes: utf8 }
  }
  if (message instanceof Uint8Array) {
    if (message.byteLength > MAX_NOTIFICATION_BYTES) throw notificationTooLarge(message.byteLength)
    return { text: undefined, bytes: Buffer.from(message) }
  }
  throw typeError('a string or Uint8Array', 'options.notify', message)
}

/** A notification as the control channel's 'n' message (the TCP transport's path). */
export function encodeNotification(payload: NoticePayload): NotifyMessage {
  const text = payload.text
  if (text === undefined) return { t: 'n', b: payload.bytes.toString('base64') }
  // Escapes could make JSON of 1 KiB six times larger: such strings travel as base64.
  return JSON.stringify(text).length <= 1400 ? { t: 'n', s: text } : { t: 'n', b: payload.bytes.toString('base64'), u: 1 }
}

/** What an 'n' message carries, as the sender gave it (string or bytes). */
export function decodeNotification(message: NotifyMessage): string | Buffer {
  const bytes = message.b === undefined ? undefined : Buffer.from(message.b, 'base64')
  return bytes === undefined ? message.s ?? '' : message.u ? bytes.toString() : bytes
}

/** Arrived notifications fanned out to the open iterators; end() finishes them all. */
export class NotificationFeed {
  readonly #pushes = new Set<(n: Notification | undefined) => void>()
  #ended = false

  push(notification: Notification): void {
    for (const push of this.#pushes) push(notification)
  }

  end(): void {
    this.#ended = true
    for (const push of [...this.#pushes]) push(undefined)
  }

  /** From now on, in arrival order; done at end() or the iterator's return(). */
  iterator(): AsyncIterableIterator<Notification> {
    const queue: Notification[] = []
    const takers: Array<(result: IteratorResult<Notification>) => void> = []
    let done = false
    const push = (n: Notification | undefined): void => {
      if (n === undefined) {
        done = true
        this.#pushes.delete(push)
        for (const take of takers.splice(0)) take({ value: undefined, done: true })
        return
      }
      const take = takers.shift()
      if (take) take({ value: n, done: false })
      else queue.push(n)
    }
    if (this.#ended) done = true
    else this.#pushes.add(push)
    const iterator: AsyncIterableIterator<Notification> = {
      next: () => {
        const queued = queue.shift()
        if (queued) return Promise.resolve({ value: queued, done: false })
        if (done) return Promise.resolve({ value: undefined, done: true })
        return new Promise((resolve) => takers.push(resolve))
      },
      return: () => {
        push(undefined)
        return Promise.resolve({ value: undefined, done: true })
      },
      [Symbol.asyncIterator]: () => iterator,
    }
    return iterator
  }
}
