// Base class for every object with a native handle: idempotent close(),
// Symbol.dispose, and parent -> child links so that closing a parent closes
// its children first. Parents hold children weakly: an unreferenced child can
// still be garbage-collected (its native finalizer frees the handle).
import { closedError } from './errors.js'

export abstract class Resource {
  #closed = false
  readonly #children = new Set<WeakRef<Resource>>()
  readonly #self = new WeakRef<Resource>(this)
  readonly #parents: Resource[] = []

  /** Closed after their siblings (memory regions: queue pairs may still name them). */
  protected readonly closeLast: boolean = false

  /** Name used in error messages, e.g. 'QueuePair'. */
  protected abstract readonly kind: string

  /** Destroys the native handle. Called once, after the children are closed. */
  protected abstract closeHandle(): void

  /** Called when this object is closed (before its handle is destroyed). */
  protected onClose(): void {}

  get closed(): boolean { return this.#closed }

  protected adoptedBy(...parents: Resource[]): void {
    for (const parent of parents) {
      parent.#children.add(this.#self)
      this.#parents.push(parent)
    }
  }

  /** Throws ERR_CLOSED when this object is closed. */
  protected assertOpen(): void {
    if (this.#closed) throw closedError(this.kind)
  }

  /** Closes the children, then this object. Idempotent. */
  close(): void {
    if (this.#closed) return
    // Newest first, regions last: queue pairs release the regions their requests name.
    const children = [...this.#children].reverse().map((ref) => ref.deref()).filter((c) => c !== undefined)
    for (const child of children) if (!child.closeLast) child.close()
    for (const child of children) if (child.closeLast) child.close()
    this.#children.clear()
    this.onClose()
    this.closeHandle()
    this.#closed = true
    for (const parent of this.#parents) parent.#children.delete(this.#self)
  }

  [Symbol.dispose](): void {
    this.close()
  }
}
