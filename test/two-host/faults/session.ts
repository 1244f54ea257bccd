// What both guests share during the fault tests: the control channel, the
// device and PD, and a data connection (host 1 connects to host 0, which
// gives it a region: READ source, WRITE target, atomic counter).
import { connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, type Connection, type Device, type Listener, type MemoryRegion, type ProtectionDomain, type RemoteRegion } from '../../../dist/index.js'
import { openControl, type Control } from './control.js'
import { ALL, passiveRegionSize } from './verbs-round.js'
import { clearNetem } from './wire.js'

export const role = process.env.SOFTROCE_HOST_INDEX ?? ''
export const local = process.env.SOFTROCE_ADDR ?? ''
export const peer = process.env.SOFTROCE_PEER_ADDR ?? ''
const CONTROL_PORT = 7480
const DATA_PORT = 7481
/**
 * The data connection's ACK timeout: ib_read_bw's and ib_write_bw's 14 (67 ms), which the campaign
 * compares with, instead of rdma_cm's 19 (2.1 s per lost packet; docs/reliability.md).
 */
export const ACK_TIMEOUT = 14

export interface Session {
  control: Control
  device: Device
  pd: ProtectionDomain
  /** Host 0: the listener that accepts data connections. */
  listener?: Listener
  /** The current data connection; replaced after a fault broke one. */
  conn: Connection
  /** Host 0: the region the current connection works on. */
  region?: MemoryRegion
  /** Host 1: host 0's region. */
  remote?: RemoteRegion
  maxBytes: number
  close(): Promise<void>
}

/** Both hosts: control channel, then the first data connection. */
export async function openSession(maxBytes: number): Promise<Session> {
  clearNetem()
  const control = await openControl(role, local, peer, CONTROL_PORT)
  const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
  const pd = device.allocPd()
  const session = { control, device, pd, maxBytes } as Session
  if (role === '0') session.listener = await listen({ host: local, port: DATA_PORT, pd })
  await newDataConnection(session)
  session.close = async () => {
    clearNetem()
    session.conn.close()
    session.region?.deregister()
    session.listener?.close()
    control.close()
    device.close()
  }
  return session
}

/** Both hosts: a fresh data connection (the old one, if any, is the caller's to close). */
export async function newDataConnection(s: Session, options: { onTimeout?: (error: Error) => void } = {}): Promise<void> {
  if (role === '0') {
    s.control.send({ type: 'listening' })
    const request = await s.listener!.accept()
    if (!request) throw new Error('the listener closed')
    const region = s.pd.allocRegion(passiveRegionSize(s.maxBytes), ALL)
    s.conn = await request.accept({ privateData: encodeDescriptors([region.describe()]), timeoutMs: 60_000, ackTimeout: ACK_TIMEOUT })
    s.region?.deregister()
    s.region = region
  } else {
    await s.control.expect('listening')
    try {
      s.conn = await connectRetrying(peer, DATA_PORT, s.pd, false, ACK_TIMEOUT)
    } catch (error) {
      // With onTimeout, a connect that timed out is reported there and tried once more.
      if (!options.onTimeout || (error as { code?: string }).code !== 'ETIMEDOUT') throw error
      options.onTimeout(error as Error)
      s.conn = await connectRetrying(peer, DATA_PORT, s.pd, false, ACK_TIMEOUT)
    }
    s.remote = remoteRegion(decodeDescriptors(s.conn.privateData)[0])
  }
}

/** connect(), retried while nobody listens yet (a peer still starting). */
export async function connectRetrying(host: string, port: number, pd: ProtectionDomain, receiveJson = false, ackTimeout?: number): Promise<Connection> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await connect({ host, port, pd, timeoutMs: 30_000, receiveJson, ...(ackTimeout === undefined ? {} : { ackTimeout }) })
    } catch (error) {
      if ((error as { code?: string }).code !== 'ECONNREFUSED' || attempt >= 120) throw error
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
}
