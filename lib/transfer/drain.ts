// Which of a link's batches are in flight, across its lanes: each lane is
// wrapped so that a batch is numbered when posted and forgotten when it
// settles (completed, failed, or flushed with the link). drained() resolves
// once every batch posted before the call has settled: after a peer's
// withdrawal ('del'), the device is then done with every work request that
// could name the withdrawn segment (later batches are refused before posting).
import type { SegmentMemory } from './segments.js'
import type { CheckedPlan } from './plan.js'
import type { Lane } from './poster.js'

export class BatchTracker {
  #posted = 0
  /** Numbers of the batches in flight, in posting order (a Set keeps insertion order). */
  readonly #open = new Set<number>()
  #waiters: Array<{ upTo: number; resolve: () => void }> = []

  /** `lane`, with its batches counted. */
  wrap(lane: Lane): Lane {
    return {
      get depth() { return lane.depth },
      get broken() { return lane.broken },
      post: (plan: CheckedPlan, from: number, to: number, regions: readonly SegmentMemory[]) => {
        const id = ++this.#posted
        const done = lane.post(plan, from, to, regions)
        this.#open.add(id)
        const settled = () => this.#settled(id)
        done.then(settled, settled)
        return done
      },
      close: () => lane.close(),
    }
  }

  /** Resolves once every batch posted before now has settled. */
  drained(): Promise<void> {
    const upTo = this.#posted
    if (this.#oldest() > upTo) return Promise.resolve()
    return new Promise((resolve) => this.#waiters.push({ upTo, resolve }))
  }

  #oldest(): number {
    for (const id of this.#open) return id
    return Infinity
  }

  #settled(id: number): void {
    this.#open.delete(id)
    if (this.#waiters.length === 0) return
    const oldest = this.#oldest()
    const ready = this.#waiters.filter((w) => oldest > w.upTo)
    if (ready.length === 0) return
    this.#waiters = this.#waiters.filter((w) => oldest <= w.upTo)
    for (const w of ready) w.resolve()
  }
}
