// The withdrawing side's wait for its peers: after unregister() sends 'del',
// each peer answers 'released' once its batches posted before the 'del' have
// settled (drain.ts); the memory is deregistered only then, so a batch
// already posted when the withdrawal crossed it lands instead of meeting a
// dead rkey (REM_ACCESS_ERR would put the peer's QP in error and fail every
// transfer on that link). Bounded: a peer that does not answer within the
// bound (frozen, or an agent that does not send 'released') is not waited
// for longer; a link that fails needs no answer (its QPs are closed).
import type { Link } from './link.js'

interface Waiter { link: Link; name: string; version: number; resolve: () => void }

export class Releases {
  #waiters: Waiter[] = []

  /** Resolves when every link of `links` released `name` (withdrawn at `version`), failed, or `boundMs` passed. */
  wait(links: readonly Link[], name: string, version: number, boundMs: number): Promise<void> {
    const healthy = links.filter((link) => link.healthy)
    if (healthy.length === 0) return Promise.resolve()
    const answers = healthy.map((link) => new Promise<void>((resolve) => this.#waiters.push({ link, name, version, resolve })))
    let timer: NodeJS.Timeout | undefined
    const bound = new Promise<void>((resolve) => { timer = setTimeout(resolve, boundMs) })
    return Promise.race([Promise.all(answers).then(() => undefined), bound]).finally(() => {
      clearTimeout(timer)
      this.#drop((w) => healthy.includes(w.link) && w.name === name && w.version === version)
    })
  }

  /** The peer on `link` released `name` as of `version`. */
  released(link: Link, name: string, version: number): void {
    this.#drop((w) => w.link === link && w.name === name && w.version <= version)
  }

  /** `link` failed: nothing on it is waited for. */
  linkGone(link: Link): void {
    this.#drop((w) => w.link === link)
  }

  #drop(match: (w: Waiter) => boolean): void {
    const gone = this.#waiters.filter(match)
    if (gone.length === 0) return
    this.#waiters = this.#waiters.filter((w) => !match(w))
    for (const w of gone) w.resolve()
  }
}
