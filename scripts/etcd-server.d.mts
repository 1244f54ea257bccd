// Types of etcd-server.mjs (plain JS) for the tests that import it (tsconfig.test.json).
import type { ChildProcess } from 'node:child_process'

/** The etcd binary (ETCD_BIN, else `etcd` on PATH), or undefined when it is not installed. */
export function etcdBinary(): string | undefined

export class EtcdServer {
  constructor(o: { bin: string, host?: string, clientPort: number, peerPort: number, dataDir: string, timeoutMs: number })
  readonly bin: string
  readonly host: string
  readonly clientPort: number
  readonly peerPort: number
  readonly dataDir: string
  readonly timeoutMs: number
  /** `http://host:clientPort` */
  readonly endpoint: string
  process: ChildProcess | undefined
  /** The last 8 KiB of etcd's stderr. */
  log: string
  get pid(): number | undefined
  get running(): boolean
  /** Starts etcd (again) on the same ports; `fresh` empties the data dir first. */
  start(options?: { fresh?: boolean }): Promise<this>
  /** Sends `signal` (default SIGKILL) and waits for the exit. */
  kill(signal?: NodeJS.Signals): Promise<void>
  /** Freezes etcd (SIGSTOP); resolves once the kernel shows it stopped. */
  pause(): Promise<void>
  resume(): void
  /** Kills etcd and removes its data dir. */
  stop(): Promise<void>
}

/** Starts a one-member etcd (free ports of 127.0.0.1 unless given) and waits until it answers /health. */
export function startEtcd(options?: { bin?: string, timeoutMs?: number, host?: string, clientPort?: number, peerPort?: number }): Promise<EtcdServer>
