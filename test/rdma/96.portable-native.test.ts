// Behaviour that the portable (prebuilt) binary changed:
// - the GID table without ibv_query_gid_ex (IBVERBS_1.11, which rdma-core 28
//   lacks): ibv_query_gid plus sysfs gives exactly the same entries;
// - openDevice() tells "no ACTIVE port" (with each port's state) from "no
//   devices" while the device's netdev is down.
import { expect } from 'vitest'
import { execFileSync, spawnSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { openDevice, RdmaError } from '../../dist/index.js'
import { testDevice } from './helpers.js'
import { envMissing, needs } from './needs.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')

needs(envMissing('SOFTROCE_DEVICE'))('the GID table read without ibv_query_gid_ex equals the one read with it', () => {
  const device = testDevice()
  let withEx
  try {
    withEx = device.gids(1)
  } finally {
    device.close()
  }
  const script = `const { openDevice } = await import(${JSON.stringify(join(root, 'dist', 'index.js'))})
    const d = openDevice(process.env.SOFTROCE_DEVICE); console.log(JSON.stringify(d.gids(1))); d.close()`
  const out = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    encoding: 'utf8', timeout: 60_000, env: { ...process.env, NODE_IBVERBS_GID_FALLBACK: '1' },
  })
  expect(out.status, out.stderr).toBe(0)
  const fallback = JSON.parse(out.stdout)
  expect(withEx.length).toBeGreaterThan(0)
  expect(withEx.some((g) => g.type === 'RoCEv2' && g.netdev === process.env.SOFTROCE_NETDEV)).toBe(true)
  expect(fallback).toEqual(withEx)
})

/** Polls until check() is true; throws after timeoutMs. */
async function until(what: string, check: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

needs(envMissing('SOFTROCE_DEVICE', 'SOFTROCE_NETDEV', 'SOFTROCE_ADDR'))('openDevice() names each port\'s state when none is ACTIVE', async () => {
  const name = process.env.SOFTROCE_DEVICE!
  const netdev = process.env.SOFTROCE_NETDEV!
  const portState = () => {
    const device = openDevice(name)
    try { return device.queryPort(1).state } finally { device.close() }
  }
  const hasAddressGid = () => {
    const device = openDevice(name)
    try { return device.gids(1).some((g) => g.gid === `::ffff:${process.env.SOFTROCE_ADDR}`) } finally { device.close() }
  }
  execFileSync('ip', ['link', 'set', netdev, 'down'])
  try {
    await until(`${name} port 1 to leave ACTIVE`, () => portState() !== 'ACTIVE')
    let error: unknown
    try { openDevice() } catch (e) { error = e }
    expect(error).toBeInstanceOf(RdmaError)
    expect((error as RdmaError).code).toBe('ENODEV')
    const message = (error as RdmaError).message
    expect(message).toMatch(new RegExp(`^No RDMA device with an ACTIVE port \\(.*${name} port 1: (DOWN|INIT|ARMED)`))
    expect(message).toContain('ip link set <netdev> up')
    expect(message).toContain('npx node-ibverbs devices')
    expect(message).not.toContain('modprobe') // that advice is for machines without devices
  } finally {
    // Later suites need the port ACTIVE and the address GID back.
    execFileSync('ip', ['link', 'set', netdev, 'up'])
    await until(`${name} port 1 to be ACTIVE again`, () => portState() === 'ACTIVE')
    await until(`the GID of ${process.env.SOFTROCE_ADDR} to return`, hasAddressGid)
  }
}, 90_000)
