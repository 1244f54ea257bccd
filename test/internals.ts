// Typed access to the @internal members of the API's objects, for the tests
// that reach below the API: dist's .d.ts leaves those members out
// (stripInternal), the objects have them at run time. Their types are lib/'s,
// so a member renamed or retyped there breaks the tests that use it here.
import type * as Api from '../dist/index.js'
import type { CQ_DISPATCH } from '../dist/verbs/completion-queue.js'
import type { CompletionQueue, CQ_DISPATCH as LIB_CQ_DISPATCH } from '../lib/verbs/completion-queue.js'
import type { Device } from '../lib/verbs/device.js'
import type { MemoryRegion } from '../lib/verbs/memory.js'
import type { MemoryWindow } from '../lib/verbs/memory-window.js'
import type { ProtectionDomain } from '../lib/verbs/protection-domain.js'
import type { QueuePair } from '../lib/verbs/queue-pair.js'

/** `T` (dist's type) with the internal members `K` of `L` (lib's class). */
type With<T, L, K extends keyof L> = T & Pick<L, K>

export function internals(device: Api.Device): With<Api.Device, Device, 'handle' | 'onAsyncEvent'>
export function internals(cq: Api.CompletionQueue): With<Api.CompletionQueue, CompletionQueue, 'handle' | 'kernelHandle'>
  & { readonly [CQ_DISPATCH]: CompletionQueue[typeof LIB_CQ_DISPATCH] }
export function internals(pd: Api.ProtectionDomain): With<Api.ProtectionDomain, ProtectionDomain, 'handle'>
export function internals(region: Api.MemoryRegion): With<Api.MemoryRegion, MemoryRegion, 'handle'>
export function internals(window: Api.MemoryWindow): With<Api.MemoryWindow, MemoryWindow, 'handle'>
export function internals(qp: Api.QueuePair): With<Api.QueuePair, QueuePair, 'handle'>
export function internals(object: object): object { return object }
