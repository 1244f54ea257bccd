// The RDMA transport: a device and its PD, an rdma_cm listener, links of RC
// QPs (rdma-link.ts), and segments as memory regions whose access flags make the
// device enforce their rights too. With several rails (rails.ts) each other
// device has a PD too, every segment is registered on each, and each rail
// has a listener of its own on its device's address (a peer whose route to
// rail 0 is down still reaches the agent over another rail).
import { isIPv6 } from 'node:net'
import { listen, type Listener, type ConnectionRequest } from '../cm/index.js'
import type { Device } from '../verbs/device.js'
import type { MemoryRegion, RegisterableMemory } from '../verbs/memory.js'
import type { ProtectionDomain } from '../verbs/protection-domain.js'
import { acceptLink, connectLink, type LinkSettings, type RdmaLink } from './rdma-link.js'
import { accessFor, type SegmentMemory, type SegmentRights } from './segments.js'
import { Access } from '../core/constants.js'
import type { GrantEnforcement } from './grants.js'
import type { AgentLinkSettings, ListenAddress, Transport } from './transport.js'

/**
 * The address a rail's listener binds: its device's IP address of `host`'s
 * family, from its GIDs (RoCE: an IPv4-mapped GID, or a global IPv6 one);
 * undefined when it has none (that rail is not listened on, nor published).
 */
export function railHost(device: Device, host: string): string | undefined {
  let gids: ReturnType<Device['gids']>
  try { gids = device.gids(1) } catch { return undefined }
  if (!isIPv6(host)) return gids.find((g) => g.gid.startsWith('::ffff:'))?.gid.slice('::ffff:'.length)
  return gids.find((g) => !g.gid.startsWith('::ffff:') && !/^fe80:/i.test(g.gid) && g.gid !== '::')?.gid
}

export class RdmaTransport implements Transport {
  readonly kind = 'rdma' as const
  readonly pd: ProtectionDomain
  /** The other rails' devices and PDs (rails.ts), in rail order. */
  readonly railPds: ProtectionDomain[] = []
  readonly grants: GrantEnforcement
  readonly #settings: LinkSettings
  readonly #handshakeMs: number
  /** One per rail listened on, in rail order (rail 0's first), with its rail. */
  readonly #listeners: Array<{ listener: Listener; rail: number; host: string }> = []
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

  get port(): number { return this.#listeners[0]?.listener.address?.port ?? 0 }

  addresses(): ListenAddress[] {
    const devices = [this.device, ...this.railDevices]
    return this.#listeners.map(({ listener, rail, host }) => ({ host, port: listener.address?.port ?? 0, device: devices[rail]!.name }))
  }

  /**
   * Listens on host:port (rail 0), and on each other rail's address (railHost)
   * at the same port, or a free one if that is taken there.
   */
  async listen(host: string, port: number, accepted: (link: Promise<RdmaLink>) => void): Promise<void> {
    await this.#listenOn(0, host, port, accepted)
    const bound = this.port
    for (let rail = 1; rail <= this.railDevices.length; rail++) {
      const railAddress = railHost(this.railDevices[rail - 1]!, host)
      if (railAddress === undefined || railAddress === host) continue
      try {
        await this.#listenOn(rail, railAddress, bound, accepted)
      } catch {
        await this.#listenOn(rail, railAddress, 0, accepted)
      }
    }
  }

  async #listenOn(rail: number, host: string, port: number, accepted: (link: Promise<RdmaLink>) => void): Promise<void> {
    const listener = await listen({ host, port, pd: rail === 0 ? this.pd : this.railPds[rail - 1]! })
    this.#listeners.push({ listener, rail, host })
    listener.on('request', (request: ConnectionRequest) => {
      if (this.#stopped) {
        try { request.reject() } catch { /* gone */ }
        return
      }
      accepted(acceptLink(this.#settings, request, this.#handshakeMs, rail))
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
      // `region` came from register() above, so it is a MemoryRegion, whose bytes are
      // ArrayBuffer-backed (a PlainMemory's, the TCP transport's, are not said to be).
      for (const pd of this.railPds) out.push(pd.registerMemory((region as MemoryRegion).bytes, this.#access(rights, perPeer)))
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
    for (const { listener } of this.#listeners) listener.close()
  }

  close(): void {
    this.stop()
    for (const rail of this.railDevices) rail.close()
    this.device.close()
  }
}
