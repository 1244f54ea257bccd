// What TransferAgent.create() reads from its options, checked once: the
// transport and device to open, the bounds, and the link settings every
// peer's link gets.
import { listDevices, openDevice, type Device } from '../verbs/device.js'
import { integer, oneOf, typeError } from '../core/validate.js'
import { MAX_QPS } from './link.js'
import type { TransferProgressListener } from './run.js'
import type { TransferAgentOptions } from './agent-options.js'
import { TRANSPORT_OPTIONS, type TransportKind } from './transport.js'
import { admissionSettings, type Admission } from './admission.js'
import { railDevices } from './rails.js'

export const DEFAULTS = { qpsPerPeer: 2, sliceBytes: 64 << 10, queueDepth: 128, batchWrs: 16, ackTimeout: 14, handshakeTimeoutMs: 10_000, stallTimeoutMs: 10_000, railRetryMs: 5000 }

/** The device that has `host` among its GIDs (RoCE), else the first active one. */
export function deviceFor(host: string, name: string | undefined): Device {
  if (name !== undefined) return openDevice(name)
  return deviceServing(host) ?? openDevice()
}

/** The device that has `host` among its GIDs, if any (none when no device or no rdma-core is there). */
export function deviceServing(host: string): Device | undefined {
  let infos: ReturnType<typeof listDevices>
  try { infos = listDevices() } catch { return undefined }
  for (const info of infos) {
    let device: Device | undefined
    try {
      device = openDevice(info.name)
      if (device.gids(1).some((g) => g.gid === `::ffff:${host}` || g.gid === host)) return device
    } catch { /* not this one */ }
    device?.close()
  }
  return undefined
}

let fallbackWarned = false

/**
 * The transport `options.transport` asks for (default 'rdma', as before the
 * option existed), with the device it opens. 'auto' is RDMA when a device
 * serves the host address (or `options.device` is given), else TCP, which is
 * said once per process with a warning (code NODE_IBVERBS_TCP_FALLBACK).
 */
export function chooseTransport(options: TransferAgentOptions): { kind: TransportKind; device: Device | undefined; rails: Device[] } {
  const choice = oneOf(options.transport, 'options.transport', TRANSPORT_OPTIONS, 'rdma')
  const devices = railDevices(options.devices, options.device, choice)
  if (choice === 'tcp') return { kind: 'tcp', device: undefined, rails: [] }
  if (devices) return { kind: 'rdma', ...openRails(devices) }
  if (choice === 'rdma') return { kind: 'rdma', device: deviceFor(options.host, options.device), rails: [] }
  const device = options.device !== undefined ? openDevice(options.device) : deviceServing(options.host)
  if (device) return { kind: 'rdma', device, rails: [] }
  if (!fallbackWarned) {
    fallbackWarned = true
    process.emitWarning(`No RDMA device serves ${options.host}: the transfer agent runs over TCP (transport 'auto'). Pass transport: 'tcp' to choose it, or 'rdma' to require a device.`,
      { code: 'NODE_IBVERBS_TCP_FALLBACK' })
  }
  return { kind: 'tcp', device: undefined, rails: [] }
}

/** Opens every rail's device (options.devices, checked): the first is the agent's device; all closed again if one fails to open. */
function openRails(names: readonly string[]): { device: Device; rails: Device[] } {
  const opened: Device[] = []
  try {
    for (const name of names) opened.push(openDevice(name))
  } catch (error) {
    for (const device of opened) device.close()
    throw error
  }
  return { device: opened[0]!, rails: opened.slice(1) }
}

export interface AgentSettings {
  qpsPerPeer: number
  sliceBytes: number
  /** The default overall bound of a transfer; none unless the options give one. */
  transferMs: number | undefined
  stallMs: number
  handshakeMs: number
  /** How long after a rail failed on a link the link is made anew to retry it (rails.ts). */
  railRetryMs: number
  queueDepth: number
  batchWrs: number
  ackTimeout: number
  pollMode: 'event' | 'busy'
  admission: Admission | undefined
}

/** `device`: the RDMA device (slices never exceed its max message size); none for TCP. */
export function agentSettings(options: TransferAgentOptions, device: Device | undefined): AgentSettings {
  const maxMessage = device?.queryPort(1).maxMessageSize || 2 ** 31
  return {
    qpsPerPeer: integer(options.qpsPerPeer ?? DEFAULTS.qpsPerPeer, 'options.qpsPerPeer', 1, MAX_QPS),
    sliceBytes: Math.min(integer(options.sliceBytes ?? DEFAULTS.sliceBytes, 'options.sliceBytes', 1, 2 ** 31), maxMessage),
    transferMs: options.transferTimeoutMs === undefined ? undefined : integer(options.transferTimeoutMs, 'options.transferTimeoutMs', 1, 2 ** 31),
    stallMs: integer(options.stallTimeoutMs ?? DEFAULTS.stallTimeoutMs, 'options.stallTimeoutMs', 1, 2 ** 31),
    handshakeMs: integer(options.handshakeTimeoutMs ?? DEFAULTS.handshakeTimeoutMs, 'options.handshakeTimeoutMs', 1, 2 ** 31),
    railRetryMs: integer(options.railRetryMs ?? DEFAULTS.railRetryMs, 'options.railRetryMs', 0, 2 ** 31),
    queueDepth: integer(options.queueDepth ?? DEFAULTS.queueDepth, 'options.queueDepth', 1, 1 << 15),
    batchWrs: integer(options.batchWrs ?? DEFAULTS.batchWrs, 'options.batchWrs', 1, 1 << 15),
    ackTimeout: integer(options.ackTimeout ?? DEFAULTS.ackTimeout, 'options.ackTimeout', 0, 31),
    pollMode: oneOf(options.pollMode, 'options.pollMode', ['event', 'busy'] as const, 'event'),
    admission: admissionSettings(options.admission),
  }
}

export interface ProgressOptions { stallTimeoutMs: number; onProgress: TransferProgressListener | undefined }

/** A transfer's stall bound (the agent's unless it gives one) and progress listener. */
export function progressOptions(o: Record<string, unknown>, stallMs: number): ProgressOptions {
  const stallTimeoutMs = integer(o.stallTimeoutMs ?? stallMs, 'options.stallTimeoutMs', 1, 2 ** 31)
  if (o.onProgress !== undefined && typeof o.onProgress !== 'function') throw typeError('a function', 'options.onProgress', o.onProgress)
  return { stallTimeoutMs, onProgress: o.onProgress as TransferProgressListener | undefined }
}
