// The verbs attributes of RESET -> INIT -> RTR -> RTS towards a peer's
// endpoint (RC, UC): from the endpoint, the port, the device's limits and
// the caller's overrides, every one checked before the first transition.
import { Access, mtuEnum, type QpTypeName } from '../core/constants.js'
import { integer, object, optionalObject, typeError } from '../core/validate.js'
import type { ConnectOptions, QpEndpoint } from './queue-pair-options.js'
import type { ProtectionDomain } from './protection-domain.js'

type Attributes = Record<string, unknown>

export function connectAttributes(qp: { readonly type: QpTypeName; readonly port: number; readonly psn: number; readonly pd: ProtectionDomain },
  gidIndex: number, remote: unknown, options: unknown): { init: Attributes; rtr: Attributes; rts: Attributes } {
  const r = object(remote, 'remote')
  const o = optionalObject(options, 'options') as Record<keyof ConnectOptions, unknown>
  if (r.version !== 1) throw typeError('an endpoint of version 1', 'remote.version', r.version)
  if (r.type !== undefined && r.type !== qp.type) throw typeError(`a ${qp.type} endpoint`, 'remote.type', r.type)
  const destQpNum = integer(r.qpn, 'remote.qpn', 0, 0xffffff)
  const rqPsn = integer(r.psn, 'remote.psn', 0, 0xffffff)
  const dlid = integer(r.lid ?? 0, 'remote.lid', 0, 0xffff)
  if (typeof r.gid !== 'string') throw typeError('a GID string', 'remote.gid', r.gid)
  const local = qp.pd.device.queryPort(qp.port)
  const remoteMtu = integer(r.mtu ?? local.activeMtu, 'remote.mtu', 256, 4096)
  const mtu = o.mtu === undefined ? Math.min(local.activeMtu, remoteMtu) : integer(o.mtu, 'options.mtu', 256, 4096)
  const device = qp.pd.device.query()
  const global = local.linkLayer === 'Ethernet' || r.gid !== '::'
  const u8 = (key: keyof ConnectOptions, fallback: number, max = 255) => integer(o[key] ?? fallback, `options.${key}`, 0, max)
  const init = {
    pkeyIndex: u8('pkeyIndex', 0, 0xffff),
    portNum: qp.port,
    accessFlags: u8('accessFlags', Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic, 0xffffffff),
  }
  const ahAttr: Attributes = { dlid, sl: u8('sl', 0, 15), portNum: qp.port }
  if (global) {
    ahAttr.grh = { dgid: r.gid, sgidIndex: gidIndex, hopLimit: u8('hopLimit', 64), trafficClass: u8('trafficClass', 0), flowLabel: u8('flowLabel', 0, 0xfffff) }
  }
  const rtr: Attributes = { pathMtu: mtuEnum(mtu), destQpNum, rqPsn, ahAttr }
  if (qp.type === 'RC') {
    rtr.maxDestRdAtomic = u8('maxDestRdAtomic', Math.min(16, device.maxQpRdAtom))
    rtr.minRnrTimer = u8('minRnrTimer', 12, 31)
  }
  const rts: Attributes = { sqPsn: qp.psn }
  if (qp.type === 'RC') {
    rts.timeout = u8('timeout', 14, 31)
    rts.retryCount = u8('retryCount', 7, 7)
    rts.rnrRetry = u8('rnrRetry', 7, 7)
    rts.maxRdAtomic = u8('maxRdAtomic', Math.min(16, device.maxQpInitRdAtom))
  }
  return { init, rtr, rts }
}

/** The JSON-safe endpoint a peer connects to: this QP's number, PSN and port's address. */
export function endpointOf(qp: { readonly type: QpTypeName; readonly qpn: number; readonly port: number; readonly psn: number; readonly pd: ProtectionDomain },
  gidIndex: number): QpEndpoint {
  const portInfo = qp.pd.device.queryPort(qp.port)
  const gid = qp.pd.device.gids(qp.port).find((g) => g.index === gidIndex)?.gid ?? '::'
  return { version: 1, type: qp.type, qpn: qp.qpn, psn: qp.psn, lid: portInfo.lid, gid, gidIndex, mtu: portInfo.activeMtu, port: qp.port }
}

/** RESET -> INIT -> RTR -> RTS of a UD QP (it then sends to address handles), from activate()'s options. */
export function udAttributes(qp: { readonly port: number; readonly psn: number }, options: unknown): { init: Attributes; rtr: Attributes; rts: Attributes } {
  const o = optionalObject(options, 'options')
  return {
    init: { pkeyIndex: integer(o.pkeyIndex ?? 0, 'options.pkeyIndex', 0, 0xffff), portNum: qp.port, qkey: integer(o.qkey ?? 0x11111111, 'options.qkey', 0, 0xffffffff) },
    rtr: {},
    rts: { sqPsn: qp.psn },
  }
}
