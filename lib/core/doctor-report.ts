// The JSON that `node-ibverbs doctor --json` prints: public API (exported from
// the package entry). Types only. A field is added, never renamed or removed,
// while `version` stays 1.

/**
 * ok: nothing to do. warn: works, with a caveat the message explains.
 * fail: something RDMA needs is broken here (the exit code is 1).
 * skip: not run, because of another check's result (the message names it) or
 * because it does not apply.
 */
export type DoctorStatus = 'ok' | 'warn' | 'fail' | 'skip'

/** The shape every check shares; `facts` is per check. */
export interface DoctorCheckOf<Id extends string, Facts> {
  id: Id
  /** What the check looked at ('rxe0 port 1', '198.18.0.1 on rxe0'); absent for the machine as a whole. */
  subject?: string
  status: DoctorStatus
  /** What was found, in a sentence or two. */
  message: string
  /** What to do about a warn or fail: commands where there are any. Absent when nothing is to be done. */
  fix?: string
  /** What was found, for programs. */
  facts: Facts
}

/** rdma-core's libraries: the files the process mapped (or ldconfig found) and the packages that provide them. */
export interface RdmaCoreFacts {
  /** File names, e.g. 'libibverbs.so.1.14.44.0'; null when not found. */
  libibverbs: string | null
  librdmacm: string | null
  /** rdma-core's release, from the library's file name (44 for libibverbs.so.1.14.44.0); null when unknown. */
  version: number | null
  /** 'mapped': the libraries this process loaded; 'ldconfig': the loader's cache (the addon did not load). */
  source: 'mapped' | 'ldconfig' | 'none'
  /** 'name version' lines from dpkg or rpm, where one is installed. */
  packages: string[]
  /** Userspace providers (drivers) libibverbs loaded, e.g. ['rxe']. */
  providers: string[]
}

/** The native addon: whether it loads, and which binary. */
export interface AddonFacts {
  loaded: boolean
  /** The .node file this process mapped. */
  binary: string | null
  /** prebuild: from the package's prebuilds/; source: built on this machine (build/); override: NODE_IBVERBS_ADDON. */
  kind: 'prebuild' | 'source' | 'override' | 'unknown' | null
  /** loadError()'s code when it does not load. */
  errorCode: string | null
}

export interface DevicesFacts {
  /** What libibverbs lists (listDevices()). */
  names: string[]
  /** What the kernel has (/sys/class/infiniband): more than `names` means a userspace provider is missing. */
  kernelDevices: string[]
}

export interface PortFacts {
  device: string
  port: number
  /** 'ACTIVE', 'DOWN', 'INIT', ... */
  state: string
  /** The physical state (sysfs phys_state), e.g. '5: LinkUp'; null when unknown. */
  physState: string | null
  linkLayer: 'Ethernet' | 'InfiniBand' | 'unspecified'
  /** The netdev under a RoCE port (or an IPoIB netdev); null when there is none. */
  netdev: string | null
  /** The netdev's operstate ('up', 'down', 'unknown'), null without a netdev. */
  netdevState: string | null
}

export interface MtuFacts {
  device: string
  port: number
  activeMtu: number
  maxMtu: number
  netdev: string | null
  netdevMtu: number | null
  /** The largest RDMA MTU the netdev's MTU carries with RoCE's headers (capped by maxMtu); null without a netdev. */
  bestMtu: number | null
}

export interface GidFacts {
  device: string
  port: number
  /** The index qp.connect() uses (device.defaultGidIndex()); null when the table is empty. */
  index: number | null
  gid: string | null
  type: 'IB' | 'RoCEv1' | 'RoCEv2' | 'unknown' | null
  netdev: string | null
  /** Entries in the table, and how many are RoCE v2, RoCE v2 with an IPv4 address, link-local. */
  entries: number
  roceV2: number
  roceV2Ipv4: number
  linkLocal: number
  /** The GID type rdma_cm uses on this port (configfs default_roce_mode); null where configfs does not say (the kernel's default is RoCE v2). */
  rdmaCmRoceMode: string | null
}

export interface MemlockFacts {
  /** The soft RLIMIT_MEMLOCK in bytes, 'unlimited', or null when /proc does not say. */
  limitBytes: number | 'unlimited' | null
  /** Bytes this process has pinned already (VmPin). */
  pinnedBytes: number | null
  /** CAP_IPC_LOCK lifts the limit (root has it). */
  capIpcLock: boolean | null
  /** --register SIZE in bytes; null without it. */
  requestedBytes: number | null
  /** The device the registration was tried on; null when it was not tried. */
  triedOn: string | null
  /** The registration's error code (ERR_MEMLOCK_LIMIT, ENOMEM, ...); null when it worked or was not tried. */
  errorCode: string | null
}

export interface RdmaCmFacts {
  device: string
  address: string
  family: 'IPv4' | 'IPv6'
  /** The port the loopback listener got. */
  port: number | null
  /** The device rdma_cm ran the connection on (should be `device`). */
  connectedDevice: string | null
  /** The connection's path MTU in bytes (from the QP). */
  pathMtu: number | null
  /** Listen, connect, accept and a message each way, in milliseconds. */
  elapsedMs: number | null
  errorCode: string | null
}

export interface LosslessFacts {
  device: string
  port: number
  netdev: string
  /** The netdev's kind ('dummy', 'veth', 'vlan', ...) or 'physical'; null when unknown. */
  kind: string | null
  /** PFC: 'on' (some priority has it), 'off', 'unknown' (Linux does not say here), 'not-applicable'. */
  pfc: 'on' | 'off' | 'unknown' | 'not-applicable'
  /** Priorities with PFC on. */
  pfcPriorities: number[]
  /** ECN for RoCE (DCQCN), where the driver exposes it in sysfs. */
  ecn: 'on' | 'off' | 'unknown' | 'not-applicable'
  /** Where the answer came from: 'dcb', 'lldptool', 'sysfs', or 'none'. */
  source: string[]
}

export interface RxeFacts {
  /** rdma_rxe is loaded (/sys/module/rdma_rxe). */
  loaded: boolean
  /** modprobe can load it (dry run); null when modprobe is missing. */
  loadable: boolean | null
  /** The `rdma` tool (iproute2) that creates rxe devices is installed. */
  rdmaTool: boolean
  kernel: string
  /** An up netdev with an IPv4 address to put rxe on, if any. */
  suggestedNetdev: string | null
}

/** A check that threw instead of answering (a machine the doctor does not expect, or a defect of it). */
export interface CheckErrorFacts {
  /** The check that threw. */
  check: Exclude<DoctorCheckId, 'doctor'>
  errorCode: string | null
}

export type RdmaCoreCheck = DoctorCheckOf<'rdma-core', RdmaCoreFacts>
export type AddonCheck = DoctorCheckOf<'addon', AddonFacts>
export type DevicesCheck = DoctorCheckOf<'devices', DevicesFacts>
export type PortCheck = DoctorCheckOf<'port', PortFacts>
export type MtuCheck = DoctorCheckOf<'mtu', MtuFacts>
export type GidCheck = DoctorCheckOf<'gid', GidFacts>
export type MemlockCheck = DoctorCheckOf<'memlock', MemlockFacts>
export type RdmaCmCheck = DoctorCheckOf<'rdma-cm', RdmaCmFacts>
export type LosslessCheck = DoctorCheckOf<'lossless', LosslessFacts>
export type RxeCheck = DoctorCheckOf<'rxe', RxeFacts>
export type CheckErrorCheck = DoctorCheckOf<'doctor', CheckErrorFacts>

/** One check: narrow on `id` to get its facts' type. */
export type DoctorCheck = RdmaCoreCheck | AddonCheck | DevicesCheck | PortCheck | MtuCheck | GidCheck
  | MemlockCheck | RdmaCmCheck | LosslessCheck | RxeCheck | CheckErrorCheck
export type DoctorCheckId = DoctorCheck['id']

export interface DoctorReport {
  version: 1
  /** No check failed (the exit code is 0). */
  ok: boolean
  /** node-ibverbs' version, process.version, and the kernel release. */
  package: string
  node: string
  kernel: string
  counts: Record<DoctorStatus, number>
  /** In the order they ran: rdma-core, addon, devices, rxe, then per port port, mtu, gid, lossless; memlock; rdma-cm per address. */
  checks: DoctorCheck[]
}
