// dma-buf memory regions (pd.registerDmabuf): memory another driver exports
// as a dma-buf fd (a GPU's, through CUDA's or ROCm's export call), registered
// with ibv_reg_dmabuf_mr. The arguments are checked here, before anything
// reaches the device; the addon looks the verb up at run time (native/dmabuf.cc).
import { native, type NativeMemoryRegion } from '../native/addon.js'
import { call, RdmaError } from '../core/errors.js'
import { Access } from '../core/constants.js'
import { integer, rangeError } from '../core/validate.js'
import type { ProtectionDomain } from './protection-domain.js'

/** The access flags ibv_reg_dmabuf_mr supports (man ibv_reg_mr). */
const DMABUF_ACCESS = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic | Access.Relaxed

/** @internal What pd.registerDmabuf() registers: a checked range of a dma-buf. */
export class DmabufRange {
  /** @internal */
  constructor(readonly fd: number, readonly offset: number, readonly length: number, readonly iova: number) {}
}

/**
 * @internal Checks registerDmabuf's arguments (ERR_INVALID_ARG_TYPE / ERR_OUT_OF_RANGE /
 * EINVAL): an fd, [offset, offset + length) and [iova, iova + length) as safe
 * integers, iova with the page offset of `offset` (the verb's rule), and
 * only the access flags the verb supports.
 */
export function dmabufRange(fd: unknown, offset: unknown, length: unknown, access: unknown, iova: unknown): DmabufRange {
  integer(fd, 'fd', 0, 0x7fffffff)
  integer(offset, 'offset', 0, Number.MAX_SAFE_INTEGER - 1)
  integer(length, 'length', 1, Number.MAX_SAFE_INTEGER - (offset as number))
  const base = iova === undefined ? offset as number : integer(iova, 'iova', 0, Number.MAX_SAFE_INTEGER - (length as number))
  const page = native.pageSize
  if (base % page !== (offset as number) % page) {
    throw rangeError(`an iova with the page offset of offset (${(offset as number) % page} in ${page}-byte pages)`, 'iova', base)
  }
  integer(access, 'access', 0, 0x7fffffff)
  if ((access as number) & ~DMABUF_ACCESS) {
    throw rangeError('LocalWrite, RemoteWrite, RemoteRead, RemoteAtomic and Relaxed only (what ibv_reg_dmabuf_mr supports)', 'access', access)
  }
  if (((access as number) & (Access.RemoteWrite | Access.RemoteAtomic)) && !((access as number) & Access.LocalWrite)) {
    throw new RdmaError('ibv_reg_dmabuf_mr: RemoteWrite and RemoteAtomic access need LocalWrite too', { code: 'EINVAL', errno: 22, syscall: 'ibv_reg_dmabuf_mr' })
  }
  return new DmabufRange(fd as number, offset as number, length as number, base)
}

/** @internal ibv_reg_dmabuf_mr; a device that cannot says so by name (EOPNOTSUPP). */
export function registerDmabufHandle(pd: ProtectionDomain, range: DmabufRange, access: number): NativeMemoryRegion {
  try {
    return call(() => new native.MemoryRegion(pd.handle, range.fd, access, range.offset, range.length, range.iova))
  } catch (error) {
    // The addon's own EOPNOTSUPP (no such symbol) already says why.
    if (error instanceof RdmaError && error.code === 'EOPNOTSUPP' && !error.message.includes('rdma-core too old')) {
      throw new RdmaError(`${pd.device.name} cannot register dma-buf memory (ibv_reg_dmabuf_mr: EOPNOTSUPP): its driver or kernel has no dma-buf support`, { code: 'EOPNOTSUPP', errno: error.errno ?? 95, syscall: 'ibv_reg_dmabuf_mr', cause: error })
    }
    throw error
  }
}
