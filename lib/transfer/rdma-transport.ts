// The RDMA transport: a device and its PD, an rdma_cm listener, links of RC
// QPs (link.ts), and segments as memory regions whose access flags make the
// device enforce their rights too.
import { listen, type Listener, type ConnectionRequest } from '../cm/index.js'
import type { Device } from '../verbs/device.js'
import type { RegisterableMemory } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import { acceptLink, connectLink, type LinkSettings, type RdmaLink } from './link.js'
import { accessFor, type SegmentMemory, type SegmentRights } from './segments.js'
import { Access } from '../core/constants.js'
import type { GrantEnforcement } from './grants.js'
import type { AgentLinkSettings, Transport } from './transport.js'

export class RdmaTransport implements Transport {
  readonly kind = 'rdma' as const
  readonly pd: ProtectionDomain
  readonly grants: GrantEnforcement
  readonly #settings: LinkSettings
  readonly #handshakeMs: number
  #listener: Listener | undefined
  #stopped = false

  constructor(readonly device: Device, settings: AgentLinkSettings, ackTimeout: number, handshakeMs: number) {
    this.pd = device.allocPd()
    const windows = device.query().maxMw > 0
    this.grants = windows ? 'windows' : 'region'
    this.#settings = { ...settings, pd: this.pd, ackTimeout, windows }
    this.#handshakeMs = handshakeMs
  }

  get port(): number { return this.#listener?.address?.port ?? 0 }

  async listen(host: string, port: number, accepted: (link: Promise<RdmaLink>) => void): Promise<void> {
    this.#listener = await listen({ host, port, pd: this.pd })
    this.#listener.on('request', (request: ConnectionRequest) => {
      if (this.#stopped) {
        try { request.reject() } catch { /* gone */ }
        return
      }
      accepted(acceptLink(this.#settings, request, this.#handshakeMs))
    })
  }

  register(source: RegisterableMemory | number, rights: SegmentRights, perPeer: boolean): SegmentMemory {
    // Granted per peer through windows: no remote access of its own, so its region rkey opens nothing.
    const access = perPeer && this.grants === 'windows' ? Access.LocalWrite | Access.MwBind : accessFor(rights)
    return typeof source === 'number' ? this.pd.allocRegion(source, access) : this.pd.registerMemory(source, access)
  }

  connect(host: string, port: number, timeoutMs: number, signal?: AbortSignal, incarnation?: string): Promise<RdmaLink> {
    return connectLink(this.#settings, host, port, timeoutMs, signal, incarnation)
  }

  stop(): void {
    this.#stopped = true
    this.#listener?.close()
  }

  close(): void {
    this.stop()
    this.device.close()
  }
}
