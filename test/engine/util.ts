// Helpers of the engine suites (test/engine/*), without verbs imports (the
// TCP run has no device); test/rdma/helpers.ts re-exports pattern() and within().
import type { Segment } from '../../dist/index.js'

export function pattern(length: number, seed: number): Uint8Array {
  const out = new Uint8Array(length)
  let x = (seed * 2654435761) >>> 0
  for (let i = 0; i < length; i++) {
    x = (x * 1103515245 + 12345) >>> 0
    out[i] = x >>> 24
  }
  return out
}

export function within<T>(promise: Promise<T>, ms = 10_000, what = 'the promise'): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const guard = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: still pending after ${ms} ms`)), ms) })
  return Promise.race([promise, guard]).finally(() => clearTimeout(timer))
}

/** Resolves once `check` holds (the peer's table arrives over the control channel), within `ms`. */
export async function until(check: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`${what}: not true after ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

export function fill(segment: Segment, seed: number): Uint8Array {
  const bytes = pattern(segment.length, seed)
  segment.bytes.set(bytes)
  return bytes
}

export function checksum(bytes: Uint8Array): number {
  let sum = 0
  for (const byte of bytes) sum = (sum * 31 + byte) >>> 0
  return sum
}

/** Where the engine suites run: the transport and the address agents listen on. */
export interface EngineEnv { transport: 'rdma' | 'tcp'; host: string }
