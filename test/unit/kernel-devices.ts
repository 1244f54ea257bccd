// What the kernel says about its RDMA devices (sysfs), to check listDevices()
// against on any machine: none on the host, rxe0 in the Soft-RoCE guest.
import { existsSync, readdirSync, readFileSync } from 'node:fs'

const CLASS = '/sys/class/infiniband'

const NODE_TYPES: Record<string, string> = { 1: 'InfiniBand channel adapter', 2: 'InfiniBand switch', 3: 'InfiniBand router', 4: 'iWARP NIC', 5: 'usNIC', 6: 'usNIC UDP' }

/** {name, guid, nodeType} of each device in /sys/class/infiniband, by name. */
export function kernelDevices(): Array<{ name: string; guid: string; nodeType: string }> {
  if (!existsSync(CLASS)) return []
  return readdirSync(CLASS).sort().map((name) => {
    const read = (file: string) => readFileSync(`${CLASS}/${name}/${file}`, 'utf8').trim()
    return { name, guid: read('node_guid'), nodeType: NODE_TYPES[read('node_type').split(':')[0]!] ?? read('node_type') }
  })
}
