// The checks of `doctor` that use the device: registering --register SIZE
// bytes against the memlock limit, and an rdma_cm connection to itself on
// each address of each port (listen, connect, accept, one message each way),
// every step bounded.
import { Access, connect, listen, openDevice } from '../index.js'
import type { Connection, Listener, RdmaError } from '../index.js'
import type { MemlockCheck, RdmaCmCheck } from '../index.js'
import { memlockState, rdmaCmDeviceFile } from './doctor-probes.js'
import type { PortView } from './doctor-checks.js'

const MEMLOCK_FIX = 'raise the locked-memory limit of the process that runs node: `ulimit -l unlimited` in its shell (as root), ' +
  'LimitMEMLOCK=infinity in a systemd unit, `--ulimit memlock=-1` for docker, a "<user> - memlock unlimited" line in ' +
  '/etc/security/limits.conf; or grant it CAP_IPC_LOCK'
/** Below this a limit is worth a warning even without --register: one KV-cache pool is usually larger. */
const SMALL_LIMIT = 64 << 20
const PAGE = 4096

export function formatBytes(bytes: number): string {
  for (const [unit, size] of [['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]] as const) {
    if (bytes >= size && bytes % (size / 16) === 0) return `${bytes / size} ${unit}`
  }
  return `${bytes} bytes`
}

/** The memlock limit against `requested` bytes; with a device (`deviceName`), registers them to be sure. */
export function memlockCheck(requested: number | null, deviceName: string | null): MemlockCheck {
  const state = memlockState()
  const facts = { limitBytes: state.limitBytes, pinnedBytes: state.pinnedBytes, capIpcLock: state.capIpcLock, requestedBytes: requested, triedOn: null as string | null, errorCode: null as string | null }
  const limitText = state.limitBytes === null ? 'unknown' : state.limitBytes === 'unlimited' ? 'unlimited' : formatBytes(state.limitBytes)
  const pinned = state.pinnedBytes ? `, ${formatBytes(state.pinnedBytes)} pinned already` : ''
  const cap = state.capIpcLock ? ' (CAP_IPC_LOCK: the limit does not apply to this process)' : ''
  const base = `RLIMIT_MEMLOCK ${limitText}${pinned}${cap}`
  const room = typeof state.limitBytes === 'number' && !state.capIpcLock ? state.limitBytes - (state.pinnedBytes ?? 0) : Infinity
  if (requested === null) {
    if (room < SMALL_LIMIT) {
      return { id: 'memlock', status: 'warn', facts, message: `${base}: registered memory is locked memory, and a registration past ${formatBytes(Math.max(0, room))} will fail (node-ibverbs doctor --register SIZE tries one)`, fix: MEMLOCK_FIX }
    }
    return { id: 'memlock', status: 'ok', facts, message: `${base}; --register SIZE tries a registration` }
  }
  const pages = Math.ceil(requested / PAGE) * PAGE
  if (deviceName === null) {
    const fits = pages <= room
    return { id: 'memlock', status: fits ? 'ok' : 'fail', facts, ...(fits ? {} : { fix: MEMLOCK_FIX }),
      message: `${base}: ${formatBytes(requested)} ${fits ? 'fits' : 'does not fit'} (not tried: no device with an ACTIVE port)` }
  }
  facts.triedOn = deviceName
  let error: RdmaError | undefined
  const device = openDevice(deviceName)
  try {
    const pd = device.allocPd()
    try {
      pd.allocRegion(requested, Access.LocalWrite).close()
    } catch (e) {
      error = e as RdmaError
    }
  } finally {
    device.close()
  }
  if (!error) return { id: 'memlock', status: 'ok', facts, message: `${base}: registered ${formatBytes(requested)} on ${deviceName}` }
  facts.errorCode = error.code ?? null
  const memlock = error.code === 'ERR_MEMLOCK_LIMIT' || pages > room
  return {
    id: 'memlock', status: 'fail', facts,
    message: `${base}: registering ${formatBytes(requested)} on ${deviceName} failed: ${error.code}: ${error.message.split('. ')[0]}`,
    fix: memlock ? MEMLOCK_FIX : 'the limit is not what refused it: check free memory and the device\'s max_mr_size (node-ibverbs devices --json)',
  }
}

/** The addresses rdma_cm can be tried on for a port: its RoCE GIDs' IPv4 and global IPv6 addresses. */
export function cmAddresses(view: PortView): Array<{ address: string; family: 'IPv4' | 'IPv6' }> {
  const seen = new Set<string>()
  const out: Array<{ address: string; family: 'IPv4' | 'IPv6' }> = []
  for (const g of view.gids) {
    if (g.type === 'IB' || /^fe80:/i.test(g.gid) || /^(::|0+(:0+)*)$/.test(g.gid)) continue
    const address = g.gid.startsWith('::ffff:') ? g.gid.slice('::ffff:'.length) : g.gid
    if (seen.has(address)) continue
    seen.add(address)
    out.push({ address, family: address.includes(':') ? 'IPv6' : 'IPv4' })
  }
  return out
}

const MTU_BYTES: Record<number, number> = { 1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096 }

/** listen, connect, accept, one JSON message each way, disconnect: all within `timeoutMs`. */
export async function rdmaCmCheck(view: PortView, address: string, family: 'IPv4' | 'IPv6', timeoutMs: number): Promise<RdmaCmCheck> {
  const subject = `${address} on ${view.name}`
  const facts = { device: view.name, address, family, port: null as number | null, connectedDevice: null as string | null, pathMtu: null as number | null, elapsedMs: null as number | null, errorCode: null as string | null }
  if (!rdmaCmDeviceFile()) {
    return { id: 'rdma-cm', subject, status: 'fail', facts, message: '/dev/infiniband/rdma_cm is missing: the rdma_ucm module is not loaded', fix: 'modprobe rdma_ucm (as root; add it to /etc/modules-load.d/ to keep it)' }
  }
  const started = Date.now()
  const deadline = started + timeoutMs
  const left = () => Math.max(1, deadline - Date.now())
  let listener: Listener | undefined
  let client: Connection | undefined
  let server: Connection | undefined
  let timer: NodeJS.Timeout | undefined
  try {
    listener = await listen({ host: address, port: 0 })
    facts.port = listener.address?.port ?? null
    const request = new Promise<Connection>((resolve, reject) => {
      timer = setTimeout(() => reject(Object.assign(new Error(`no connection request within ${timeoutMs} ms`), { code: 'ETIMEDOUT' })), left())
      listener!.accept().then((r) => r ? r.accept({ receiveJson: true, timeoutMs: left() }) : Promise.reject(new Error('the listener closed')))
        .then(resolve, reject)
    })
    const connecting = connect({ host: address, port: facts.port!, timeoutMs: left(), receiveJson: true })
    const [a, b] = await Promise.allSettled([connecting, request])
    if (a.status === 'fulfilled') client = a.value
    if (b.status === 'fulfilled') server = b.value
    if (a.status === 'rejected') throw a.reason
    if (b.status === 'rejected') throw b.reason
    facts.connectedDevice = client!.device.name
    await client!.sendJson({ doctor: 'ping' }, { timeoutMs: left() })
    const ping = await server!.receiveJson({ timeoutMs: left() }) as { doctor?: string }
    await server!.sendJson({ doctor: 'pong' }, { timeoutMs: left() })
    const pong = await client!.receiveJson({ timeoutMs: left() }) as { doctor?: string }
    if (ping.doctor !== 'ping' || pong.doctor !== 'pong') throw Object.assign(new Error(`messages arrived altered: ${JSON.stringify([ping, pong])}`), { code: 'ERR_DATA_MISMATCH' })
    facts.pathMtu = MTU_BYTES[client!.qp.query().pathMtu as number] ?? null
    await client!.disconnect({ timeoutMs: left() })
    facts.elapsedMs = Date.now() - started
  } catch (error) {
    const e = error as RdmaError
    facts.errorCode = e.code ?? 'ERR_UNKNOWN'
    return { id: 'rdma-cm', subject, status: 'fail', facts, message: `loopback connection failed: ${e.code ?? ''} ${e.message}`.replace(/\s+/g, ' '), fix: cmFix(e, view, address) }
  } finally {
    clearTimeout(timer)
    client?.close()
    server?.close()
    listener?.close()
  }
  const elsewhere = facts.connectedDevice !== view.name
  const hostPort = family === 'IPv6' ? `[${address}]:${facts.port}` : `${address}:${facts.port}`
  const message = `listen, connect, accept and a message each way to ${hostPort} in ${facts.elapsedMs} ms, on ${facts.connectedDevice}, path MTU ${facts.pathMtu ?? 'unknown'}`
  if (elsewhere) {
    return { id: 'rdma-cm', subject, status: 'warn', facts, message: `${message}: rdma_cm routed ${address} through ${facts.connectedDevice}, not ${view.name}`,
      fix: `check which netdev owns ${address} (ip addr) and which RDMA device sits on it (rdma link)` }
  }
  return { id: 'rdma-cm', subject, status: 'ok', facts, message }
}

function cmFix(error: RdmaError, view: PortView, address: string): string {
  switch (error.code) {
    case 'ADDR_ERROR': case 'ROUTE_ERROR': case 'ENODEV': case 'EADDRNOTAVAIL':
      return `rdma_cm cannot map ${address} to an RDMA device: the address must be on the netdev under ${view.name} (${view.netdev ?? '?'}), not on lo or another interface (ip addr; rdma link)`
    case 'ETIMEDOUT':
      return `nothing answered within the bound: check the port is ACTIVE, that nothing drops UDP port 4791 (RoCE v2) on ${view.netdev ?? 'the netdev'} (iptables/nft), and that rdma_ucm is loaded`
    case 'ECONNREFUSED': case 'EHOSTUNREACH': case 'CONNECT_ERROR':
      return 'the connection was refused or unreachable on the device itself: check the GID table (gid check above) and the port state'
    default:
      return 'run with --json for the error code; check the port, GID and MTU checks above'
  }
}
