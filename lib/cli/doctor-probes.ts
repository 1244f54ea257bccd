// What `doctor` reads from the machine besides the verbs API: /proc, sysfs,
// configfs, and the tools that may be installed (dpkg, rpm, ldconfig,
// modprobe, rdma, ip, dcb, lldptool). Every probe answers "unknown" (null)
// rather than guess when its source is missing.
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs'
import { networkInterfaces, release } from 'node:os'
import { basename } from 'node:path'

/** A file's text, trimmed; undefined when it cannot be read. */
export function readText(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim()
  } catch {
    return undefined
  }
}

export function listDir(path: string): string[] {
  try {
    return readdirSync(path).sort()
  } catch {
    return []
  }
}

export interface Ran { found: boolean; status: number | null; stdout: string; stderr: string }

/** Runs a tool with a bound (a probe must not hang the doctor); found is false when it is not installed. */
export function runTool(command: string, args: string[], timeoutMs = 5000): Ran {
  const result = spawnSync(command, args, { encoding: 'utf8', timeout: timeoutMs, stdio: ['ignore', 'pipe', 'pipe'] })
  const missing = (result.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT'
  return { found: !missing, status: result.status, stdout: result.stdout ?? '', stderr: result.stderr ?? '' }
}

/** The files this process has mapped (/proc/self/maps), each once. */
export function mappedFiles(): string[] {
  const text = readText('/proc/self/maps') ?? ''
  const files = new Set<string>()
  for (const line of text.split('\n')) {
    const path = line.split(/\s+/).slice(5).join(' ')
    if (path.startsWith('/')) files.add(path)
  }
  return [...files]
}

/** rdma-core's release from a library file name: libibverbs.so.1.14.44.0 -> 44 (the third number). */
export function rdmaCoreRelease(file: string): number | null {
  const match = /^lib(?:ibverbs|rdmacm)\.so\.\d+\.\d+\.(\d+)(?:\.\d+)?$/.exec(basename(file))
  return match ? Number(match[1]) : null
}

/** libibverbs and librdmacm as the loader's cache knows them (ldconfig -p), resolved to their files. */
export function ldconfigLibraries(): { libibverbs: string | null; librdmacm: string | null } {
  const out = runTool('ldconfig', ['-p']).stdout || runTool('/sbin/ldconfig', ['-p']).stdout
  const find = (soname: string): string | null => {
    const line = out.split('\n').find((l) => l.trim().startsWith(`${soname} `) && /x86-64|AArch64|aarch64|64bit/.test(l)) ??
      out.split('\n').find((l) => l.trim().startsWith(`${soname} `))
    const path = line?.split('=>')[1]?.trim()
    if (!path) return null
    try { return realpathSync(path) } catch { return path }
  }
  return { libibverbs: find('libibverbs.so.1'), librdmacm: find('librdmacm.so.1') }
}

/** 'name version' of rdma-core's packages from dpkg or rpm, whichever is installed. */
export function rdmaPackages(): string[] {
  const dpkg = runTool('dpkg-query', ['-W', '-f', '${db:Status-Abbrev} ${Package} ${Version}\\n',
    'rdma-core', 'libibverbs1', 'librdmacm1', 'ibverbs-providers', 'libibverbs-dev', 'librdmacm-dev'])
  if (dpkg.found) {
    return dpkg.stdout.split('\n').filter((l) => l.startsWith('ii')).map((l) => l.slice(2).trim().split(/\s+/).join(' '))
  }
  const rpm = runTool('rpm', ['-q', '--qf', '%{NAME} %{VERSION}-%{RELEASE}\\n', 'rdma-core', 'libibverbs', 'librdmacm', 'rdma-core-devel'])
  if (rpm.found) return rpm.stdout.split('\n').filter((l) => l && !l.includes('not installed'))
  return []
}

const SYS_IB = '/sys/class/infiniband'

/** The RDMA devices the kernel has. */
export function kernelRdmaDevices(): string[] {
  return listDir(SYS_IB)
}

/** The netdev a device's port runs over: the netdev of GID 0 in sysfs (RoCE), or an IPoIB netdev of the device (IB). */
export function portNetdev(device: string, port: number): string | null {
  const ndev = readText(`${SYS_IB}/${device}/ports/${port}/gid_attrs/ndevs/0`)
  if (ndev) return ndev
  const parent = readText(`${SYS_IB}/${device}/parent`) // rxe, siw
  if (parent) return parent
  const nets = listDir(`${SYS_IB}/${device}/device/net`)
  return nets[0] ?? null
}

/** The software device's netdev (rxe, siw have a `parent`), or undefined for hardware. */
export function softwareParent(device: string): string | undefined {
  return readText(`${SYS_IB}/${device}/parent`)
}

export function physState(device: string, port: number): string | null {
  return readText(`${SYS_IB}/${device}/ports/${port}/phys_state`) ?? null
}

/** The GID type rdma_cm uses on a port, where configfs has the device's directory; null otherwise. */
export function rdmaCmRoceMode(device: string, port: number): string | null {
  return readText(`/sys/kernel/config/rdma_cm/${device}/ports/${port}/default_roce_mode`) ?? null
}

export interface NetdevInfo { name: string; mtu: number | null; operstate: string | null; kind: string | null; lower: string[] }

/** A netdev's MTU, operstate, kind (ip -d: dummy, veth, vlan, ...; 'physical' with a device behind it) and lower devices. */
export function netdevInfo(name: string): NetdevInfo {
  const base = `/sys/class/net/${name}`
  const mtu = Number(readText(`${base}/mtu`))
  let kind: string | null = null
  const ip = runTool('ip', ['-d', '-j', 'link', 'show', 'dev', name])
  if (ip.status === 0) {
    try {
      const [link] = JSON.parse(ip.stdout) as Array<{ link_type?: string; linkinfo?: { info_kind?: string } }>
      kind = link?.linkinfo?.info_kind ?? (link?.link_type === 'loopback' ? 'loopback' : null)
    } catch { /* unknown */ }
  }
  if (kind === null && existsSync(`${base}/device`)) kind = 'physical'
  const lower = listDir(base).filter((f) => f.startsWith('lower_')).map((f) => f.slice('lower_'.length))
  return { name, mtu: Number.isFinite(mtu) && mtu > 0 ? mtu : null, operstate: readText(`${base}/operstate`) ?? null, kind, lower }
}

/** An up netdev (not lo) with an IPv4 address, to suggest for rxe. */
export function suggestNetdev(): string | null {
  for (const [name, addresses] of Object.entries(networkInterfaces())) {
    if (name === 'lo' || !addresses) continue
    if (readText(`/sys/class/net/${name}/operstate`) === 'down') continue
    if (addresses.some((a) => a.family === 'IPv4' && !a.internal)) return name
  }
  return null
}

export interface MemlockState { limitBytes: number | 'unlimited' | null; pinnedBytes: number | null; capIpcLock: boolean | null }

const CAP_IPC_LOCK = 14n

/** RLIMIT_MEMLOCK (soft), VmPin and CAP_IPC_LOCK of this process, from /proc. */
export function memlockState(): MemlockState {
  const limits = readText('/proc/self/limits') ?? ''
  const line = limits.split('\n').find((l) => l.startsWith('Max locked memory'))
  const soft = line?.slice('Max locked memory'.length).trim().split(/\s+/)[0]
  const status = readText('/proc/self/status') ?? ''
  const pin = /^VmPin:\s+(\d+) kB/m.exec(status)
  const caps = /^CapEff:\s+([0-9a-f]+)/m.exec(status)
  return {
    limitBytes: soft === undefined ? null : soft === 'unlimited' ? 'unlimited' : Number(soft),
    pinnedBytes: pin ? Number(pin[1]) * 1024 : null,
    capIpcLock: caps ? ((BigInt('0x' + caps[1]) >> CAP_IPC_LOCK) & 1n) === 1n : null,
  }
}

export interface RxeState { loaded: boolean; loadable: boolean | null; rdmaTool: boolean; kernel: string; why: string }

/** Whether Soft-RoCE can be set up here: rdma_rxe loaded or loadable (modprobe --dry-run), and the `rdma` tool. */
export function rxeState(): RxeState {
  const kernel = release()
  const loaded = existsSync('/sys/module/rdma_rxe')
  let loadable: boolean | null = loaded ? true : null
  let why = ''
  if (!loaded) {
    const probe = runTool('modprobe', ['--dry-run', '--quiet', 'rdma_rxe'])
    if (probe.found) {
      loadable = probe.status === 0
      if (!loadable) why = existsSync(`/lib/modules/${kernel}`) ? 'modprobe finds no rdma_rxe module' : `no modules for this kernel (/lib/modules/${kernel} is missing)`
    } else {
      why = 'modprobe is not installed'
    }
  }
  return { loaded, loadable, rdmaTool: runTool('rdma', ['-V']).found, kernel, why }
}

export interface PfcState { pfc: 'on' | 'off' | 'unknown'; priorities: number[]; source: string | null; note: string }

/** PFC of a netdev from `dcb pfc show` (iproute2) or `lldptool`, where present and the driver answers. */
export function pfcState(netdev: string): PfcState {
  const notes: string[] = []
  const dcb = runTool('dcb', ['pfc', 'show', 'dev', netdev])
  if (dcb.found) {
    const match = /prio-pfc((?:\s+\d:(?:on|off))+)/.exec(dcb.stdout)
    if (dcb.status === 0 && match) {
      const priorities = [...match[1]!.matchAll(/(\d):on/g)].map((m) => Number(m[1]))
      return { pfc: priorities.length ? 'on' : 'off', priorities, source: 'dcb', note: '' }
    }
    notes.push(`dcb pfc show: ${(dcb.stderr || dcb.stdout).trim().split('\n')[0] || `exit ${dcb.status}`}`)
  } else {
    notes.push('dcb (iproute2) is not installed')
  }
  const lldp = runTool('lldptool', ['-t', '-i', netdev, '-V', 'PFC'])
  if (lldp.found) {
    const match = /enabled:?\s*([0-9 ]+|none)\s*$/im.exec(lldp.stdout)
    if (lldp.status === 0 && match) {
      const priorities = match[1]!.trim() === 'none' ? [] : match[1]!.trim().split(/\s+/).map(Number)
      return { pfc: priorities.length ? 'on' : 'off', priorities, source: 'lldptool', note: '' }
    }
    notes.push(`lldptool: ${(lldp.stderr || lldp.stdout).trim().split('\n')[0] || `exit ${lldp.status}`}`)
  }
  return { pfc: 'unknown', priorities: [], source: null, note: notes.join('; ') }
}

/** RoCE ECN (DCQCN) where the driver exposes it: /sys/class/net/<netdev>/ecn/roce_{np,rp}/enable/<prio> (mlx5). */
export function ecnState(netdev: string): { ecn: 'on' | 'off' | 'unknown'; source: string | null } {
  const base = `/sys/class/net/${netdev}/ecn`
  const flags: string[] = []
  for (const side of ['roce_np', 'roce_rp']) {
    for (const prio of listDir(`${base}/${side}/enable`)) {
      const value = readText(`${base}/${side}/enable/${prio}`)
      if (value !== undefined) flags.push(value)
    }
  }
  if (flags.length === 0) return { ecn: 'unknown', source: null }
  return { ecn: flags.some((f) => f === '1') ? 'on' : 'off', source: 'sysfs' }
}

/** The rdma_cm character device (the rdma_ucm module makes it). */
export function rdmaCmDeviceFile(): boolean {
  return existsSync('/dev/infiniband/rdma_cm')
}
