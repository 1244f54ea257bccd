// The machine's and each port's checks of `doctor`: rdma-core, the addon,
// devices, Soft-RoCE, port state, MTU, the GID table and the lossless
// settings of RoCE. Each returns its verdict with the facts it found and the
// fix to apply; none of them changes the machine.
import { basename, sep } from 'node:path'
import type { Device, GidEntry, PortInfo, RdmaError } from '../index.js'
import type {
  AddonCheck, DevicesCheck, GidCheck, LosslessCheck, MtuCheck, PortCheck, RdmaCoreCheck, RxeCheck,
} from '../index.js'
import {
  ecnState, kernelRdmaDevices, ldconfigLibraries, listDir, mappedFiles, netdevInfo, pfcState, physState,
  portNetdev, rdmaCmRoceMode, rdmaCoreRelease, rdmaPackages, softwareParent, suggestNetdev,
  type RxeState,
} from './doctor-probes.js'

/** The oldest rdma-core the prebuilt binaries load on (scripts/prebuilds/floor.mjs). */
const RDMA_CORE_FLOOR = 28
const RUNTIME_FIX = 'install rdma-core\'s runtime: apt-get install libibverbs1 librdmacm1 ibverbs-providers ' +
  '(RHEL/Fedora: dnf install rdma-core libibverbs librdmacm; Alpine: apk add rdma-core)'

export function rdmaCoreCheck(): RdmaCoreCheck {
  const mapped = mappedFiles()
  const lib = (name: string) => mapped.find((f) => basename(f).startsWith(`${name}.so`))
  let libibverbs = lib('libibverbs')
  let librdmacm = lib('librdmacm')
  let source: 'mapped' | 'ldconfig' | 'none' = libibverbs ? 'mapped' : 'none'
  if (!libibverbs || !librdmacm) {
    const cache = ldconfigLibraries()
    libibverbs ??= cache.libibverbs ?? undefined
    librdmacm ??= cache.librdmacm ?? undefined
    if (libibverbs && source === 'none') source = 'ldconfig'
  }
  const providers = mapped.map((f) => /\/libibverbs\/lib([\w-]+?)-rdmav\d+\.so$/.exec(f)?.[1]).filter((p): p is string => !!p).sort()
  const packages = rdmaPackages()
  const version = libibverbs ? rdmaCoreRelease(libibverbs) : null
  const facts = {
    libibverbs: libibverbs ? basename(libibverbs) : null, librdmacm: librdmacm ? basename(librdmacm) : null,
    version, source, packages, providers,
  }
  const where = source === 'mapped' ? 'loaded by this process' : 'in the loader\'s cache (ldconfig -p)'
  const from = packages.length ? `; packages: ${packages.join(', ')}` : ''
  const drivers = providers.length ? `; providers loaded: ${providers.join(', ')}` : ''
  if (!libibverbs || !librdmacm) {
    const missing = [!libibverbs && 'libibverbs.so.1', !librdmacm && 'librdmacm.so.1'].filter(Boolean).join(' and ')
    return { id: 'rdma-core', status: 'fail', message: `${missing} not found (neither loaded nor in ldconfig -p)${from}`, fix: RUNTIME_FIX, facts }
  }
  const message = `rdma-core ${version ?? '(release unknown)'}: ${facts.libibverbs}, ${facts.librdmacm}, ${where}${drivers}${from}`
  if (version !== null && version < RDMA_CORE_FLOOR) {
    return { id: 'rdma-core', status: 'warn', message: `${message}; older than ${RDMA_CORE_FLOOR}, the prebuilt binaries' floor`,
      fix: `update rdma-core to ${RDMA_CORE_FLOOR} or newer, or build the addon from source (npm rebuild node-ibverbs --build-from-source)`, facts }
  }
  if (listDir('/etc/libibverbs.d').length === 0 && providers.length === 0) {
    return { id: 'rdma-core', status: 'warn', message: `${message}; no userspace providers (/etc/libibverbs.d is empty): libibverbs cannot drive any device`,
      fix: 'apt-get install ibverbs-providers (RHEL/Fedora: dnf install libibverbs)', facts }
  }
  return { id: 'rdma-core', status: 'ok', message, facts }
}

export function addonCheck(error: RdmaError | null): AddonCheck {
  if (error) {
    const [first, ...rest] = error.message.split('\n')
    return {
      id: 'addon', status: 'fail', message: first!,
      fix: rest.join('\n').replace(/^Possible fixes:\n/, '').trim() || RUNTIME_FIX,
      facts: { loaded: false, binary: null, kind: null, errorCode: error.code },
    }
  }
  const binary = mappedFiles().find((f) => f.endsWith('.node') && /ibverbs/.test(basename(f))) ?? null
  const override = process.env.NODE_IBVERBS_ADDON
  const kind = binary === null ? 'unknown'
    : override ? 'override'
      : binary.includes(`${sep}prebuilds${sep}`) ? 'prebuild'
        : binary.includes(`${sep}build${sep}`) ? 'source' : 'unknown'
  const how = { prebuild: 'the prebuilt binary', source: 'a build from source', override: 'NODE_IBVERBS_ADDON\'s binary', unknown: 'the binary' }[kind]
  return { id: 'addon', status: 'ok', message: `loads: ${how} ${binary ?? '(not found in /proc/self/maps)'}`, facts: { loaded: true, binary, kind, errorCode: null } }
}

/** `rxe` names how to get a device when there is none. */
export function devicesCheck(names: string[], rxe: RxeState): DevicesCheck {
  const kernel = kernelRdmaDevices()
  const facts = { names, kernelDevices: kernel }
  const unlisted = kernel.filter((k) => !names.includes(k))
  if (unlisted.length) {
    return {
      id: 'devices', status: 'fail', facts,
      message: `the kernel has ${unlisted.join(', ')} but libibverbs does not list ${unlisted.length > 1 ? 'them' : 'it'}: no userspace provider (driver library) matches`,
      fix: 'apt-get install ibverbs-providers (RHEL/Fedora: dnf install libibverbs; check /etc/libibverbs.d/ has the driver)',
    }
  }
  if (names.length === 0) {
    return { id: 'devices', status: 'fail', facts, message: 'no RDMA device on this machine', fix: softRoceFix(rxe) }
  }
  const described = names.map((n) => {
    const parent = softwareParent(n)
    return parent ? `${n} (software, over ${parent})` : n
  })
  return { id: 'devices', status: 'ok', message: `${names.length} device${names.length > 1 ? 's' : ''}: ${described.join(', ')}`, facts }
}

/** How to get a Soft-RoCE device on this machine (rxe here, or a QEMU guest). */
function softRoceFix(rxe: RxeState): string {
  const netdev = suggestNetdev() ?? '<netdev>'
  const guest = 'node-ibverbs softroce run -- <command> (a QEMU guest with Soft-RoCE, rxe)'
  if (rxe.loaded || rxe.loadable) {
    const tool = rxe.rdmaTool ? '' : 'apt-get install iproute2 (for `rdma`), then '
    return `for Soft-RoCE (rxe), as root: ${tool}modprobe rdma_rxe && rdma link add rxe0 type rxe netdev ${netdev} ` +
      `(or: node-ibverbs softroce up); or use an InfiniBand/RoCE NIC; or ${guest}`
  }
  return `this kernel (${rxe.kernel}) cannot load rdma_rxe (${rxe.why}): run under ${guest}, ` +
    'or use a kernel with rdma_rxe (most distribution kernels), or an InfiniBand/RoCE NIC'
}

export function rxeCheck(rxe: RxeState, deviceCount: number): RxeCheck {
  const facts = { loaded: rxe.loaded, loadable: rxe.loadable, rdmaTool: rxe.rdmaTool, kernel: rxe.kernel, suggestedNetdev: suggestNetdev() }
  if (deviceCount > 0) {
    return { id: 'rxe', status: 'skip', message: `not needed: ${deviceCount} device${deviceCount > 1 ? 's' : ''} present${rxe.loaded ? ' (rdma_rxe is loaded)' : ''}`, facts }
  }
  if ((rxe.loaded || rxe.loadable) && rxe.rdmaTool) {
    return { id: 'rxe', status: 'ok', message: `Soft-RoCE is available: rdma_rxe is ${rxe.loaded ? 'loaded' : 'loadable'} and \`rdma\` is installed`, facts }
  }
  if (rxe.loaded || rxe.loadable) {
    return { id: 'rxe', status: 'warn', message: 'rdma_rxe can be loaded, but the `rdma` tool (iproute2) that creates the device is missing', fix: 'apt-get install iproute2', facts }
  }
  return {
    id: 'rxe', status: 'warn', facts,
    message: `Soft-RoCE is not available on this kernel (${rxe.kernel}): ${rxe.why || 'rdma_rxe cannot be loaded'}`,
    fix: 'node-ibverbs softroce run -- <command> boots a QEMU guest with Debian\'s kernel and rxe (sudo bash scripts/softroce.sh provision installs QEMU)',
  }
}

export interface PortView { device: Device; name: string; port: number; info: PortInfo; netdev: string | null; gids: GidEntry[] }

export function portCheck(view: PortView): PortCheck {
  const { name, port, info, netdev } = view
  const net = netdev ? netdevInfo(netdev) : undefined
  const phys = physState(name, port)
  const facts = { device: name, port, state: info.state, physState: phys, linkLayer: info.linkLayer, netdev, netdevState: net?.operstate ?? null }
  const subject = `${name} port ${port}`
  const over = netdev ? ` over ${netdev} (operstate ${net?.operstate ?? 'unknown'})` : ''
  const message = `${info.state}, ${info.linkLayer}${over}${phys ? `, physical state ${phys}` : ''}`
  if (info.state === 'ACTIVE') return { id: 'port', subject, status: 'ok', message, facts }
  let fix: string
  if (info.linkLayer === 'InfiniBand') {
    fix = info.state === 'INIT'
      ? 'the link is up but no subnet manager configured it: start one on the fabric (opensm, or the switch\'s SM)'
      : 'the link is down: check the cable and the switch port (ibstat shows the physical state)'
  } else if (net?.operstate === 'down' || net?.operstate === 'lowerlayerdown') {
    fix = `bring the netdev up: ip link set ${netdev} up (and check its cable/carrier)`
  } else {
    fix = `check the link under ${netdev ?? 'the port'}: cable, switch port, carrier (ip link show ${netdev ?? '<netdev>'})`
  }
  return { id: 'port', subject, status: 'fail', message: `not ACTIVE: ${message}`, fix, facts }
}

/** RoCE v2's headers over a netdev's MTU: IPv6 40 (IPv4 20) + UDP 8 + BTH 12 + the largest extended header 16 + ICRC 4 (rxe reserves 80). */
const ROCE_HEADERS = 80
const RDMA_MTUS = [4096, 2048, 1024, 512, 256]

export function mtuCheck(view: PortView): MtuCheck {
  const { name, port, info, netdev } = view
  const subject = `${name} port ${port}`
  const net = netdev ? netdevInfo(netdev) : undefined
  const netdevMtu = net?.mtu ?? null
  const best = netdevMtu === null ? null : RDMA_MTUS.find((m) => m <= info.maxMtu && m + ROCE_HEADERS <= netdevMtu) ?? 256
  const facts = { device: name, port, activeMtu: info.activeMtu, maxMtu: info.maxMtu, netdev, netdevMtu, bestMtu: info.linkLayer === 'Ethernet' ? best : null }
  const base = `active MTU ${info.activeMtu} (max ${info.maxMtu})`
  if (info.linkLayer !== 'Ethernet' || netdevMtu === null || best === null) {
    return { id: 'mtu', subject, status: 'ok', message: `${base}${info.linkLayer === 'InfiniBand' ? ': InfiniBand sets it per link' : ''}`, facts }
  }
  if (info.activeMtu + ROCE_HEADERS > netdevMtu) {
    return {
      id: 'mtu', subject, status: 'fail', facts,
      message: `${base} does not fit ${netdev}'s MTU ${netdevMtu} with RoCE's ${ROCE_HEADERS} header bytes: full-size packets would be dropped`,
      fix: `raise ${netdev}'s MTU to at least ${info.activeMtu + ROCE_HEADERS} on every hop (ip link set ${netdev} mtu ${info.activeMtu + ROCE_HEADERS}), or lower the port's`,
    }
  }
  if (info.activeMtu < best) {
    return {
      id: 'mtu', subject, status: 'warn', facts,
      message: `${base} is below the ${best} that ${netdev}'s MTU ${netdevMtu} carries: each packet moves less than it could`,
      fix: `the driver sets the active MTU from the netdev: set ${netdev}'s MTU again (ip link set ${netdev} mtu ${netdevMtu}) or check the NIC's settings`,
    }
  }
  const jumbo = info.activeMtu < Math.min(4096, info.maxMtu) ? `; MTU 4096 needs ${4096 + ROCE_HEADERS}+ on ${netdev} and on every hop (jumbo frames, 9000 is usual)` : ''
  return { id: 'mtu', subject, status: 'ok', message: `${base}: the largest ${netdev}'s MTU ${netdevMtu} carries${jumbo}`, facts }
}

const isIpv4Mapped = (gid: string) => gid.startsWith('::ffff:')
const isLinkLocal = (gid: string) => /^fe80:/i.test(gid)

export function gidCheck(view: PortView): GidCheck {
  const { device, name, port, info, gids } = view
  const subject = `${name} port ${port}`
  const v2 = gids.filter((g) => g.type === 'RoCEv2')
  const v2Ipv4 = v2.filter((g) => isIpv4Mapped(g.gid))
  const linkLocal = gids.filter((g) => isLinkLocal(g.gid))
  const index = gids.length ? device.defaultGidIndex(port) : null
  const picked = gids.find((g) => g.index === index)
  const roceMode = rdmaCmRoceMode(name, port)
  const facts = {
    device: name, port, index, gid: picked?.gid ?? null, type: picked?.type ?? null, netdev: picked?.netdev ?? null,
    entries: gids.length, roceV2: v2.length, roceV2Ipv4: v2Ipv4.length, linkLocal: linkLocal.length, rdmaCmRoceMode: roceMode,
  }
  if (!picked && info.state !== 'ACTIVE') {
    return { id: 'gid', subject, status: 'skip', facts, message: `the GID table is empty while the port is ${info.state} (port check): the kernel fills it when the port comes up` }
  }
  if (!picked) {
    return { id: 'gid', subject, status: 'fail', facts, message: 'the GID table is empty: no connection can be addressed',
      fix: info.linkLayer === 'Ethernet' ? `bring the netdev up and give it an address (ip addr add <addr>/<len> dev ${view.netdev ?? '<netdev>'})` : 'check the port is ACTIVE and the subnet manager assigned it' }
  }
  if (/^(::|0+(:0+)*)$/.test(picked.gid)) {
    return { id: 'gid', subject, status: 'fail', facts, message: `GID index ${picked.index} is NULL (${picked.gid})`, fix: 'choose another index (createQp({ gidIndex })) or fix the netdev\'s addresses' }
  }
  const at = `GID index ${picked.index} (${picked.gid}, ${picked.type}${picked.netdev ? ` on ${picked.netdev}` : ''})`
  if (info.linkLayer !== 'Ethernet') {
    return { id: 'gid', subject, status: 'ok', facts, message: `${at}: InfiniBand addresses by LID and GID ${picked.index} (${gids.length} entries)` }
  }
  const cm = `rdma_cm picks the GID of the address it binds, of type ${roceMode ?? 'RoCE v2 (the kernel\'s default)'}`
  if (v2Ipv4.length) {
    return {
      id: 'gid', subject, status: 'ok', facts,
      message: `qp.connect() uses ${at}: the first RoCE v2 GID with an IPv4 address, the one an IPv4 peer on the same subnet reaches; ${cm} (${gids.length} entries, ${v2.length} RoCE v2)`,
    }
  }
  const addFix = `give ${view.netdev ?? 'the netdev'} an IPv4 address (ip addr add <addr>/<len> dev ${view.netdev ?? '<netdev>'}): the kernel then adds its RoCE v2 GID`
  if (v2.length && v2.every((g) => isLinkLocal(g.gid))) {
    return { id: 'gid', subject, status: 'warn', facts,
      message: `only link-local RoCE v2 GIDs (${v2.map((g) => g.gid).join(', ')}): qp.connect() uses ${at}, which only reaches the same L2 segment, and rdma_cm has no IPv4 address to bind`,
      fix: addFix }
  }
  if (v2.length) {
    return { id: 'gid', subject, status: 'warn', facts,
      message: `no RoCE v2 GID with an IPv4 address: qp.connect() uses ${at} (IPv6); an IPv4 peer cannot be reached`, fix: addFix }
  }
  return { id: 'gid', subject, status: 'warn', facts,
    message: `no RoCE v2 GID (only ${[...new Set(gids.map((g) => g.type))].join(', ')}): qp.connect() uses ${at}; RoCE v1 is not routable (one L2 segment)`,
    fix: 'use a kernel and NIC with RoCE v2 (the default on Linux 4.5+ with rdma-core); check /sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types' }
}

export function losslessCheck(view: PortView): LosslessCheck | undefined {
  const { name, port, info, netdev } = view
  if (info.linkLayer !== 'Ethernet' || !netdev) return undefined
  const subject = `${name} port ${port} (${netdev})`
  const net = netdevInfo(netdev)
  if (net.kind === 'dummy' || net.kind === 'loopback') {
    return { id: 'lossless', subject, status: 'ok', facts: { device: name, port, netdev, kind: net.kind, pfc: 'not-applicable', pfcPriorities: [], ecn: 'not-applicable', source: [] },
      message: `${netdev} is a ${net.kind} netdev: its traffic never leaves this machine, so there is no fabric to make lossless` }
  }
  // A VLAN or bond carries its PFC on the device below it.
  const candidates = [netdev, ...net.lower]
  let pfc = pfcState(netdev)
  let pfcOn = netdev
  for (const lower of net.lower) {
    if (pfc.pfc !== 'unknown') break
    pfc = pfcState(lower)
    pfcOn = lower
  }
  const ecn = candidates.map((c) => ({ c, ...ecnState(c) })).find((e) => e.ecn !== 'unknown') ?? { c: netdev, ecn: 'unknown' as const, source: null }
  const source = [pfc.source, ecn.source].filter((s): s is string => s !== null)
  const facts = { device: name, port, netdev, kind: net.kind, pfc: pfc.pfc, pfcPriorities: pfc.priorities, ecn: ecn.ecn, source: source.length ? source : ['none'] }
  const pfcText = pfc.pfc === 'unknown' ? `PFC unknown (${pfc.note})` : `PFC ${pfc.pfc}${pfc.priorities.length ? ` on priorities ${pfc.priorities.join(',')}` : ''} (${pfc.source} on ${pfcOn})`
  const ecnText = ecn.ecn === 'unknown' ? 'ECN unknown (no RoCE ECN in sysfs)' : `ECN ${ecn.ecn} (sysfs on ${ecn.c})`
  const why = 'RoCE needs a lossless fabric (PFC) or congestion control (ECN/DCQCN): on a lossy one, each lost packet costs a retransmission timeout and throughput falls 100-1000x'
  const fix = `enable PFC on the RoCE priority end to end (NIC: dcb pfc set dev ${pfcOn} prio-pfc 3:on, or the vendor's tool such as mlnx_qos; and the same on every switch port), ` +
    'and ECN (DCQCN) where the NIC and switches support it; docs/reliability.md shows what loss costs'
  if (pfc.pfc === 'on' || ecn.ecn === 'on') return { id: 'lossless', subject, status: 'ok', facts, message: `${pfcText}; ${ecnText}` }
  if (pfc.pfc === 'off') return { id: 'lossless', subject, status: 'warn', facts, message: `${pfcText}; ${ecnText}: ${why}`, fix }
  return { id: 'lossless', subject, status: 'warn', facts, message: `${pfcText}; ${ecnText}: Linux does not say whether this fabric is lossless. ${why}`, fix: `check the NIC's and switches' PFC/ECN settings: ${fix}` }
}

/** Each port of each device, with what the port checks need; a device that cannot be opened is reported as a failure. */
export function portViews(openDevice: (name: string) => Device, names: string[]): { views: PortView[]; broken: Array<{ name: string; error: Error }> } {
  const views: PortView[] = []
  const broken: Array<{ name: string; error: Error }> = []
  for (const name of names) {
    let device: Device
    try {
      device = openDevice(name)
    } catch (error) {
      broken.push({ name, error: error as Error })
      continue
    }
    const ports = device.query().physPortCount
    for (let port = 1; port <= ports; port++) {
      views.push({ device, name, port, info: device.queryPort(port), netdev: portNetdev(name, port), gids: device.gids(port) })
    }
  }
  return { views, broken }
}
