// fork() and registered memory. Old kernels shared a registered page with a
// forked child copy-on-write: the parent's next write moved the parent to a
// new page while the device kept the old one. Kernels from 5.13 copy pinned
// pages into the child at fork instead, and libibverbs reports 'unneeded'.
import { native } from '../native/addon.js'
import { call, RdmaError } from '../core/errors.js'

/**
 * 'unneeded': the kernel keeps registered memory with the parent across
 * fork(); 'enabled': ibv_fork_init() (or RDMAV_FORK_SAFE=1) protects it;
 * 'disabled': neither.
 */
export type ForkSupport = 'disabled' | 'enabled' | 'unneeded'

/** What libibverbs says about fork() (ibv_is_fork_initialized). */
export function forkSupport(): ForkSupport {
  return call(() => native.forkStatus())
}

/**
 * ibv_fork_init(), as RDMAV_FORK_SAFE=1 would do, where it is needed (a
 * no-op where forkSupport() is 'unneeded'). Returns the new forkSupport().
 * libibverbs refuses it once memory has been registered: RdmaError EINVAL
 * (syscall 'ibv_fork_init'); call it first, or set RDMAV_FORK_SAFE=1.
 */
export function enableForkSupport(): ForkSupport {
  const now = forkSupport()
  if (now !== 'disabled') return now // rdma-core 44 says EINVAL here once memory is registered, though nothing is missing
  try {
    call(() => native.forkInit())
  } catch (error) {
    if (error instanceof RdmaError && error.code === 'EINVAL') {
      throw new RdmaError('ibv_fork_init: too late, memory is registered already: call enableForkSupport() before registering any memory, or start node with RDMAV_FORK_SAFE=1',
        { code: 'EINVAL', errno: 22, syscall: 'ibv_fork_init', cause: error })
    }
    throw error
  }
  return forkSupport()
}
