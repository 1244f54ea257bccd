// After rdma_cm's DEVICE_REMOVAL: librdmacm closes a removed device's context
// (and the kernel can then finish the removal: rxe has no disassociate, so
// `rdma link delete` waits for every open context) only when a look at the
// device list no longer finds the device and nothing holds its context. The
// event arrives before the kernel takes the device out of that list, so the
// list is looked at again until the device is gone from it.
import { native } from '../native/addon.js'

const POLL_MS = 250
// A removal that never completes is not watched forever (a minute of polls).
const MAX_POLLS = 240

const watched = new Map<string, number>() // device name -> polls so far
let timer: NodeJS.Timeout | undefined

/** Lets librdmacm close `device`'s context once it left the device list (null: the id knew no device). */
export function releaseRemovedDevice(device: string | null): void {
  native.releaseRemovedDevices()
  if (device === null || !listed(device)) return
  watched.set(device, 0)
  // Unref'd: a process may exit meanwhile (the kernel then closes everything).
  timer ??= setInterval(poll, POLL_MS).unref()
}

function poll(): void {
  native.releaseRemovedDevices()
  for (const [device, polls] of watched) {
    if (!listed(device) || polls + 1 >= MAX_POLLS) watched.delete(device)
    else watched.set(device, polls + 1)
  }
  if (watched.size === 0) {
    clearInterval(timer)
    timer = undefined
  }
}

function listed(device: string): boolean {
  try {
    return native.listDevices().some((d) => d.name === device)
  } catch {
    return false // no device list at all: nothing left to look for
  }
}
