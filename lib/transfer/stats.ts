// Per-peer counters and transfer latency percentiles for agent.stats().

/** Counters of one peer (or of all peers, in `total`). */
export interface PeerStats {
  bytes: number
  transfers: number
  workRequests: number
  notificationsSent: number
  notificationsReceived: number
  errors: number
  reconnects: number
  /** Transfers started and not settled yet. */
  inFlight: number
  /** Transfer latency (start to settle, successful transfers), over the last 1024 of them. */
  p50Ms: number
  p99Ms: number
}

const WINDOW = 1024

export class PeerCounters {
  bytes = 0
  transfers = 0
  workRequests = 0
  notificationsSent = 0
  notificationsReceived = 0
  errors = 0
  reconnects = 0
  inFlight = 0
  readonly #latencies = new Float64Array(WINDOW)
  #seen = 0

  recordLatency(ms: number): void {
    this.#latencies[this.#seen++ % WINDOW] = ms
  }

  latencies(): Float64Array {
    return this.#latencies.slice(0, Math.min(this.#seen, WINDOW))
  }

  snapshot(): PeerStats {
    const [p50Ms, p99Ms] = percentiles(this.latencies(), [0.5, 0.99])
    return {
      bytes: this.bytes, transfers: this.transfers, workRequests: this.workRequests,
      notificationsSent: this.notificationsSent, notificationsReceived: this.notificationsReceived,
      errors: this.errors, reconnects: this.reconnects, inFlight: this.inFlight, p50Ms: p50Ms!, p99Ms: p99Ms!,
    }
  }
}

/** Nearest-rank percentiles of `values` (0 when empty). */
export function percentiles(values: Float64Array, ranks: readonly number[]): number[] {
  if (values.length === 0) return ranks.map(() => 0)
  const sorted = values.slice().sort()
  return ranks.map((rank) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(rank * sorted.length) - 1))]!)
}

/** Sums peers' counters; percentiles over all their recent latencies. */
export function totalStats(peers: readonly PeerCounters[]): PeerStats {
  const sum = (key: 'bytes' | 'transfers' | 'workRequests' | 'notificationsSent' | 'notificationsReceived' | 'errors' | 'reconnects' | 'inFlight') =>
    peers.reduce((total, peer) => total + peer[key], 0)
  const all = new Float64Array(peers.reduce((n, p) => n + p.latencies().length, 0))
  let at = 0
  for (const peer of peers) { const l = peer.latencies(); all.set(l, at); at += l.length }
  const [p50Ms, p99Ms] = percentiles(all, [0.5, 0.99])
  return {
    bytes: sum('bytes'), transfers: sum('transfers'), workRequests: sum('workRequests'),
    notificationsSent: sum('notificationsSent'), notificationsReceived: sum('notificationsReceived'),
    errors: sum('errors'), reconnects: sum('reconnects'), inFlight: sum('inFlight'), p50Ms: p50Ms!, p99Ms: p99Ms!,
  }
}
