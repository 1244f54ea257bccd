// The RDMA transport: a device and its PD, an rdma_cm listener, links of RC
// QPs (link.ts), and segments as memory regions whose access flags make the
// device enforce their rights too. With several rails (rails.ts) each other
// device has a PD too, and every segment is registered on each.
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
  /** The other rails' devices and PDs (rails.ts), in rail order. */
  readonly railPds: ProtectionDomain[] = []
  readonly grants: GrantEnforcement
  readonly #settings: LinkSettings
  readonly #handshakeMs: number
  #listener: Listener | undefined
  #stopped = false

  constructor(readonly device: Device, settings: AgentLinkSettings, ackTimeout: number, handshakeMs: number, readonly railDevices: readonly Device[] = []) {
    this.pd = device.allocPd()
    for (const rail of railDevices) this.railPds.push(rail.allocPd())
    // Windows only when every rail has them (a grant binds one on each rail's QPs).
    const windows = [device, ...railDevices].every((d) => d.query().maxMw > 0)
    this.grants = windows ? 'windows' : 'region'
    this.#settings = { ...settings, pd: this.pd, railPds: this.railPds, ackTimeout, windows }
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
    const region = typeof source === 'number' ? this.pd.allocRegion(source, this.#access(rights, perPeer)) : this.pd.registerMemory(source, this.#access(rights, perPeer))
    return region
  }

  /** The same memory registered on each other rail's PD, with the same rights (closed again if one fails). */
  registerRails(region: SegmentMemory, rights: SegmentRights, perPeer: boolean): SegmentMemory[] {
    const out: SegmentMemory[] = []
    try {
      for (const pd of this.railPds) out.push(pd.registerMemory(region.bytes, this.#access(rights, perPeer)))
    } catch (error) {
      for (const r of out) r.close()
      throw error
    }
    return out
  }

  #access(rights: SegmentRights, perPeer: boolean): number {
    // Granted per peer through windows: no remote access of its own, so its region rkey opens nothing.
    return perPeer && this.grants === 'windows' ? Access.LocalWrite | Access.MwBind : accessFor(rights)
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
    for (const rail of this.railDevices) rail.close()
    this.device.close()
  }
}
