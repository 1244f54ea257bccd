// Why ibv_reg_mr said ENOMEM: pinning memory counts against RLIMIT_MEMLOCK
// (the kernel's ib_umem_get refuses past it unless the process has
// CAP_IPC_LOCK). Read only on that failure path, from /proc.
import { readFileSync } from 'node:fs'
import { RdmaError } from './errors.js'

const CAP_IPC_LOCK = 14n

/** The soft RLIMIT_MEMLOCK in bytes (Infinity when unlimited), or undefined where /proc can't say. */
export function memlockLimit(procFile = '/proc/self/limits'): number | undefined {
  try {
    const line = readFileSync(procFile, 'utf8').split('\n').find((l) => l.startsWith('Max locked memory'))
    const soft = line?.slice('Max locked memory'.length).trim().split(/\s+/)[0]
    if (soft === undefined) return undefined
    return soft === 'unlimited' ? Infinity : Number(soft)
  } catch {
    return undefined
  }
}

/** Bytes this process has pinned already (VmPin), and whether it holds CAP_IPC_LOCK. */
function pinState(procFile = '/proc/self/status'): { pinnedBytes?: number; ipcLock?: boolean } {
  try {
    const text = readFileSync(procFile, 'utf8')
    const pin = text.match(/^VmPin:\s+(\d+) kB/m)
    const caps = text.match(/^CapEff:\s+([0-9a-f]+)/m)
    return {
      ...(pin ? { pinnedBytes: Number(pin[1]) * 1024 } : {}),
      ...(caps ? { ipcLock: ((BigInt('0x' + caps[1]) >> CAP_IPC_LOCK) & 1n) === 1n } : {}),
    }
  } catch {
    return {}
  }
}

/**
 * `error` (ENOMEM from ibv_reg_mr) as ERR_MEMLOCK_LIMIT when the memlock
 * limit is what refused it: the limit is finite and the process lacks
 * CAP_IPC_LOCK. Otherwise `error` unchanged.
 */
export function explainRegistrationFailure(error: unknown, length: number,
  proc: { limits: string; status: string } = { limits: '/proc/self/limits', status: '/proc/self/status' }): unknown {
  if (!(error instanceof RdmaError) || error.code !== 'ENOMEM' || error.syscall !== 'ibv_reg_mr') return error
  const limit = memlockLimit(proc.limits)
  const { pinnedBytes, ipcLock } = pinState(proc.status)
  if (limit === undefined || limit === Infinity || ipcLock === true) return error
  const pinned = pinnedBytes === undefined ? '' : ` (${pinnedBytes} bytes are pinned already)`
  return new RdmaError(
    `ibv_reg_mr: cannot pin ${length} bytes: RLIMIT_MEMLOCK is ${limit} bytes${pinned} and the process lacks CAP_IPC_LOCK. ` +
    'Registered memory is locked memory: raise the limit for the process that runs node (`ulimit -l unlimited` in its shell, ' +
    'LimitMEMLOCK=infinity in a systemd unit, `--ulimit memlock=-1` for docker, memlock in /etc/security/limits.conf) or grant it CAP_IPC_LOCK',
    { code: 'ERR_MEMLOCK_LIMIT', errno: error.errno ?? 12, syscall: 'ibv_reg_mr', cause: error },
  )
}
