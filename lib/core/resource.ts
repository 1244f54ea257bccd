// Base class for every object with a native handle: idempotent close(),
// Symbol.dispose, and parent -> child links so that closing a parent closes
// its children first. Parents hold children weakly: an unreferenced child can
// still be garbage-collected (its native finalizer frees the handle). The
// `closed` state follows the native one: it is set only once the handle is gone.
import { closedError, RdmaError, type RdmaErrorDetails } from './errors.js'
import type { RdmaErrorCode } from './error-codes.js'

/**
 * A child the GC collected leaves its WeakRef in its parents' sets: this
 * takes it out (else a long-lived PD's set grows with every region dropped).
 * The held value names the set, not the parent: the parent stays collectable.
 */
const collected = new FinalizationRegistry<{ children: Set<WeakRef<Resource>>; ref: WeakRef<Resource> }>(
  ({ children, ref }) => { children.delete(ref) })

export abstract class Resource {
  #closed = false
  readonly #children = new Set<WeakRef<Resource>>()
  readonly #self = new WeakRef<Resource>(this)
  readonly #parents: Resource[] = []

  /** Closed after their siblings (memory regions: queue pairs may still name them). */
  protected readonly closeLast: boolean = false

  /** Name used in error messages, e.g. 'QueuePair'. */
  protected abstract readonly kind: string

  /** Destroys the native handle. Throws if it refused: the object then stays open. */
  protected abstract closeHandle(): void

  /** Called before the handle is destroyed; may throw to refuse the close (the object stays open). */
  protected onClose(): void {}

  /** Called once this object's handle is destroyed (undo tracking here, not in onClose). */
  protected afterClose(): void {}

  get closed(): boolean { return this.#closed }

  protected adoptedBy(...parents: Resource[]): void {
    for (const parent of parents) {
      parent.#children.add(this.#self)
      this.#parents.push(parent)
      collected.register(this, { children: parent.#children, ref: this.#self }, this.#self)
    }
  }

  /** Throws ERR_CLOSED when this object is closed. */
  protected assertOpen(): void {
    if (this.#closed) throw closedError(this.kind)
  }

  /**
   * Closes the children, newest first (regions last), then this object.
   * Transactional: if a child or this handle refuses, close() throws and that
   * child and this object stay open and usable (the children closed before it
   * stay closed). Idempotent.
   */
  close(): void {
    if (this.#closed) return
    // Newest first, regions last: queue pairs release the regions their requests name.
    const children = [...this.#children].reverse().map((ref) => ref.deref()).filter((c) => c !== undefined)
    for (const child of children) if (!child.closeLast) this.#closeChild(child)
    for (const child of children) if (child.closeLast) this.#closeChild(child)
    this.onClose()
    this.closeHandle()
    this.#closed = true
    this.#children.clear()
    for (const parent of this.#parents) parent.#children.delete(this.#self)
    collected.unregister(this.#self)
    this.afterClose()
  }

  #closeChild(child: Resource): void {
    try {
      child.close()
    } catch (error) {
      const e = error as { code?: string; errno?: number; syscall?: string; message?: string }
      const details: RdmaErrorDetails = { code: (e.code ?? 'ERR_UNKNOWN') as RdmaErrorCode, cause: error }
      if (e.errno !== undefined) details.errno = e.errno
      if (e.syscall !== undefined) details.syscall = e.syscall
      throw new RdmaError(`${this.kind} stays open: its ${child.kind} could not be closed (${e.message})`, details)
    }
  }

  [Symbol.dispose](): void {
    this.close()
  }
}
