// What the two-host benches (two-host.mjs, transfer-two-host.mjs) share: the
// environment of the two-host topology (which guest this is, the addresses,
// the device) and perftest's client retried until the other guest's server
// listens (the two guests boot and start their servers at their own pace).
import { PERFTEST, roceV2Ipv4GidIndex, run } from './perftest.mjs'

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** The value after `--name` on the command line, or `fallback`. */
export function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : fallback
}

/** The median of the numbers in `all`, NaN (a run with no figure) left out. */
export function median(all) {
  const s = all.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b)
  const n = s.length
  return n === 0 ? NaN : n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2
}

/**
 * The two-host topology's environment: host '0' or '1', the peer's and this
 * guest's address, the device and its RoCE v2 GID index. Throws, naming
 * `script`, when not run in that topology.
 */
export function twoHostEnv(script) {
  const host = process.env.SOFTROCE_HOST_INDEX
  const deviceName = process.env.SOFTROCE_DEVICE ?? 'rxe0'
  if (host !== '0' && host !== '1') throw new Error(`run me with: bash scripts/softroce.sh run --topology two-host -- node ${script}`)
  return { host, peer: process.env.SOFTROCE_PEER_ADDR, local: process.env.SOFTROCE_ADDR, deviceName, gidIndex: roceV2Ipv4GidIndex(deviceName) }
}

/** The perftest tool and arguments for `test` on `port` (both ends; the client adds the peer's address). */
export function perftestArgs(env, { test, size, iters, txDepth }, port) {
  const [tool, ...extra] = PERFTEST[test]
  const args = [...extra, '-d', env.deviceName, '-x', String(env.gidIndex), '-F', '-p', String(port), '-n', String(iters), '-s', String(size)]
  if (test.endsWith('_bw')) args.push('-t', String(txDepth))
  return [tool, args]
}

/** Runs perftest's client against the peer's server: retried every 500 ms (60 times) while that server is not listening yet. */
export async function perftestClient(tool, args, peer, timeoutMs) {
  let client
  for (let attempt = 0; attempt < 60; attempt++) {
    await sleep(500)
    client = await run(tool, [...args, peer], timeoutMs)
    if (!/Couldn't connect|Unable to init the socket/.test(client.out)) break
  }
  return client
}
