// A progress line for long CLI work (`node-ibverbs bench transfer`): bytes,
// rate and time left, redrawn in place at most every 200 ms, on a terminal
// only. Piped or redirected output gets no progress noise, only the summary
// the command prints at the end.
import { performance } from 'node:perf_hooks'

/** Where the line goes: a TTY stream draws it; any other stream gets nothing. */
export interface ProgressStream { isTTY?: boolean; columns?: number; write(text: string): unknown }

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB']

export function formatBytes(bytes: number): string {
  let value = bytes
  let unit = 0
  while (value >= 1024 && unit < UNITS.length - 1) { value /= 1024; unit++ }
  return `${unit === 0 ? value.toFixed(0) : value.toFixed(value >= 100 ? 0 : 1)} ${UNITS[unit]}`
}

export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return '?'
  const s = Math.round(seconds)
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`
}

/** `label: done / total (pct), rate/s, ETA t` (rate and ETA once some time has passed). */
export function formatProgress(label: string, done: number, total: number, seconds: number): string {
  const pct = total > 0 ? Math.min(100, (done / total) * 100) : 100
  const rate = seconds > 0 ? done / seconds : 0
  const eta = rate > 0 ? (total - done) / rate : Number.NaN
  return `${label}: ${formatBytes(done)} / ${formatBytes(total)} (${pct.toFixed(0)}%)${rate > 0 ? `, ${formatBytes(rate)}/s, ETA ${formatDuration(eta)}` : ''}`
}

export class ProgressLine {
  readonly #stream: ProgressStream
  readonly #label: string
  readonly #total: number
  readonly #started: number
  readonly #now: () => number
  #drawn = 0
  #lastDraw = -Infinity

  /** `now`: milliseconds (performance.now by default). */
  constructor(stream: ProgressStream, label: string, total: number, now: () => number = () => performance.now()) {
    this.#stream = stream
    this.#label = label
    this.#total = total
    this.#now = now
    this.#started = now()
  }

  get drawing(): boolean { return this.#stream.isTTY === true }

  /** `done` bytes so far: redrawn if 200 ms passed since the last draw (or at the end). */
  update(done: number): void {
    if (!this.drawing) return
    const now = this.#now()
    if (now - this.#lastDraw < 200 && done < this.#total) return
    this.#lastDraw = now
    const width = Math.max(20, (this.#stream.columns || 80) - 1)
    const line = formatProgress(this.#label, done, this.#total, (now - this.#started) / 1000).slice(0, width)
    this.#stream.write(`\r${line}${' '.repeat(Math.max(0, this.#drawn - line.length))}`)
    this.#drawn = line.length
  }

  /** Clears the line (the command prints its summary next). */
  end(): void {
    if (!this.drawing || this.#drawn === 0) return
    this.#stream.write(`\r${' '.repeat(this.#drawn)}\r`)
    this.#drawn = 0
  }
}
