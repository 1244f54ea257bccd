// Types of perftest.mjs (plain JS) for the tests that import it (tsconfig.test.json).

export type PerftestName = 'write_bw' | 'read_bw' | 'send_bw' | 'atomic_fadd_bw' | 'atomic_cas_bw' | 'write_lat' | 'read_lat' | 'send_lat'

/** Our test name -> perftest tool and extra arguments. */
export const PERFTEST: Record<PerftestName, string[]>

/** The GID index of the port's RoCE v2 IPv4 GID (from sysfs), else 0. */
export function roceV2Ipv4GidIndex(device: string, port?: number): number

/** Runs a command to its end (killed after timeoutMs), stdout and stderr in `out`; code -1 when it could not start. */
export function run(cmd: string, args: readonly string[], timeoutMs: number): Promise<{ code: number | null, signal?: NodeJS.Signals | null, out: string }>

export interface BwResult { kind: 'bw', size: number, iters: number, mbPerSec: number, mpps: number, peak: number }
export interface LatResult {
  kind: 'lat', size: number, iters: number, tMin: number, tMax: number,
  tTypical: number, tAvg: number, p99: number, p999: number
}
export type PerftestResult = BwResult | LatResult

/** One perftest measurement (server and client on `device`); throws with the tool's output when there is no result. */
export function perftest(options: {
  test: PerftestName, size: number, iters: number, txDepth: number, device: string, gidIndex: number, addr: string,
  timeoutMs?: number, wrap?: readonly string[],
}): Promise<PerftestResult & { command: string }>

/** Parses the result table of an ib_*_bw or ib_*_lat run. */
export function parse(output: string): PerftestResult | undefined
