// fork() and registered memory. Old kernels shared a registered page with a
// forked child copy-on-write: the parent's next write moved the parent to a
// new page while the device kept the old one. Kernels from 5.13 copy pinned
// pages into the child at fork instead, and libibverbs reports 'unneeded'.
import { native } from './native.js'
import { call } from './errors.js'

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
 * ibv_fork_init(), as RDMAV_FORK_SAFE=1 would do: call it before registering
 * any memory, and only where forkSupport() is 'disabled'. Returns the new
 * forkSupport(). Throws an RdmaError (syscall 'ibv_fork_init') on failure.
 */
export function enableForkSupport(): ForkSupport {
  call(() => native.forkInit())
  return forkSupport()
}
