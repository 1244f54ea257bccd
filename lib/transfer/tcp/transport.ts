// The TCP transport: no device. Segments are plain memory, keyed for the
// wire; peers connect to a node:net server; links are TCP links (link.ts
// here), whose receiving side enforces the segments' rights and bounds.
import { createServer, type Server } from 'node:net'
import { RdmaError } from '../../core/errors.js'
import type { RegisterableMemory } from '../../verbs/memory.js'
import type { Link } from '../link.js'
import { PlainMemory, plainBytes } from '../plain-memory.js'
import type { SegmentRights } from '../segments.js'
import type { AgentLinkSettings, ListenAddress, Transport } from '../transport.js'
import { acceptTcpLink, connectTcpLink, type TcpLinkSettings } from './link.js'

export class TcpTransport implements Transport {
  readonly kind = 'tcp' as const
  readonly device = undefined
  readonly pd = undefined
  readonly grants = 'software' as const
  readonly #memories = new Map<number, PlainMemory>()
  readonly #settings: TcpLinkSettings
  readonly #handshakeMs: number
  #nextKey = 1
  #server: Server | undefined
  #host: string | undefined
  #stopped = false

  constructor(settings: AgentLinkSettings, handshakeMs: number) {
    this.#settings = { ...settings, lookup: (key) => this.#memories.get(key) }
    this.#handshakeMs = handshakeMs
  }

  get port(): number {
    const address = this.#server?.address()
    return typeof address === 'object' && address !== null ? address.port : 0
  }

  addresses(): ListenAddress[] {
    return this.#host === undefined ? [] : [{ host: this.#host, port: this.port, device: 'tcp' }]
  }

  listen(host: string, port: number, accepted: (link: Promise<Link>) => void): Promise<void> {
    this.#host = host
    const server = createServer((socket) => {
      if (this.#stopped) return void socket.destroy()
      accepted(acceptTcpLink(this.#settings, socket, this.#handshakeMs))
    })
    this.#server = server
    return new Promise((resolve, reject) => {
      server.once('error', (error: NodeJS.ErrnoException) => reject(new RdmaError(`Cannot listen on ${host}:${port}: ${error.message}`,
        { code: (/^E[A-Z0-9]+$/.test(error.code ?? '') ? error.code : 'EADDRNOTAVAIL') as 'EADDRNOTAVAIL', cause: error })))
      server.listen(port, host, () => resolve())
    })
  }

  register(source: RegisterableMemory | number, rights: SegmentRights, perPeer: boolean): PlainMemory {
    let bytes: Uint8Array
    if (typeof source === 'number') {
      try { bytes = new Uint8Array(source) } catch (error) { throw new RdmaError(`Cannot allocate ${source} bytes: ${(error as Error).message}`, { code: 'ENOMEM', cause: error }) }
    } else {
      bytes = plainBytes(source)
    }
    const memory = new PlainMemory(bytes, this.#nextKey++, rights, perPeer, (m) => this.#memories.delete(m.key))
    this.#memories.set(memory.key, memory)
    return memory
  }

  connect(host: string, port: number, timeoutMs: number, signal?: AbortSignal, incarnation?: string): Promise<Link> {
    return connectTcpLink(this.#settings, host, port, timeoutMs, signal, incarnation)
  }

  stop(): void {
    if (this.#stopped) return
    this.#stopped = true
    this.#server?.close()
  }

  close(): void {
    this.stop()
    for (const memory of [...this.#memories.values()]) memory.close()
  }
}
