// Types of soak.mjs (plain JS) for the tests that import it (tsconfig.test.json).

export interface KernelCounts { qp: number, cq: number, pd: number, mr: number }
export interface SoakSample extends KernelCounts {
  at: number
  seconds: number
  rssMiB: number
  fds: number
  ops: number
  bytesVerified: number
}

/** Kernel RDMA objects of this process, by kind. */
export function kernelCounts(): KernelCounts

/** What grew from the first sample to a later one (RSS beyond the slack, plus ASan's quarantine when `env` preloads libasan). */
export function growthOf(samples: readonly SoakSample[], rssSlackMiB: number, env?: Record<string, string | undefined>): string[]

/** Runs the soak; `log` gets one line per sample. */
export function soak(options?: {
  seconds?: number, interval?: number, pairs?: number, rssSlackMiB?: number, device?: string, log?: (line: string) => void,
}): Promise<{
  ok: boolean, seconds: number, pairs: number, qps: number, samples: SoakSample[],
  ops: number, bytesVerified: number, error: string | undefined, growth: string[],
}>
