// Runs perftest's tools (server and client on one device) and parses their output.
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'

/** Our test name -> perftest tool and extra arguments. */
export const PERFTEST = {
  write_bw: ['ib_write_bw'],
  read_bw: ['ib_read_bw'],
  send_bw: ['ib_send_bw'],
  atomic_fadd_bw: ['ib_atomic_bw', '-A', 'FETCH_AND_ADD'],
  atomic_cas_bw: ['ib_atomic_bw', '-A', 'CMP_AND_SWAP'],
  write_lat: ['ib_write_lat'],
  read_lat: ['ib_read_lat'],
  send_lat: ['ib_send_lat'],
}

/** The GID index of the port's RoCE v2 IPv4 GID (from sysfs), else 0. */
export function roceV2Ipv4GidIndex(device, port = 1) {
  for (let i = 0; i < 256; i++) {
    let gid, type
    try {
      gid = readFileSync(`/sys/class/infiniband/${device}/ports/${port}/gids/${i}`, 'utf8').trim()
      type = readFileSync(`/sys/class/infiniband/${device}/ports/${port}/gid_attrs/types/${i}`, 'utf8').trim()
    } catch {
      if (i > 0 && gid === undefined) break
      continue
    }
    if (/v2/i.test(type) && gid.startsWith('0000:0000:0000:0000:0000:ffff:')) return i
  }
  return 0
}

/** Runs a command to its end (killed after timeoutMs): { code, signal, out } with stdout and stderr. */
export function run(cmd, args, timeoutMs) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout.on('data', (d) => { out += d })
    child.stderr.on('data', (d) => { out += d })
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
    child.on('close', (code, signal) => { clearTimeout(timer); resolve({ code, signal, out }) })
    child.on('error', (e) => { clearTimeout(timer); resolve({ code: -1, out: String(e) }) })
  })
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
let nextPort = 18515 + Math.floor(Math.random() * 1000)

/**
 * Runs one perftest measurement: the server in the background, then the
 * client against `addr` (retried while the server is not listening yet).
 * Returns the parsed result row, or throws with the tool's output.
 */
export async function perftest({ test, size, iters, txDepth, device, gidIndex, addr, timeoutMs = 60_000, wrap = [] }) {
  const [tool, ...extra] = PERFTEST[test]
  const port = String(nextPort++)
  const args = [...extra, '-d', device, '-x', String(gidIndex), '-F', '-p', port, '-n', String(iters)]
  if (!test.startsWith('atomic')) args.push('-s', String(size))
  if (test.endsWith('_bw')) args.push('-t', String(Math.max(1, Math.min(txDepth, iters))))
  // `wrap`: a command prefix for both ends, e.g. ['chrt', '-f', '50'].
  const exec = (a) => (wrap.length ? run(wrap[0], [...wrap.slice(1), tool, ...a], timeoutMs) : run(tool, a, timeoutMs))
  const server = exec(args)
  let client
  for (let attempt = 0; attempt < 20; attempt++) {
    await sleep(attempt === 0 ? 300 : 500)
    client = await exec([...args, addr])
    if (!/Couldn't connect|Unable to init the socket/.test(client.out)) break
  }
  const srv = await server
  const parsed = parse(client.out)
  if (!parsed) {
    throw new Error(`${tool} ${[...args, addr].join(' ')} gave no result (exit ${client.code})\n${client.out}\n--- server:\n${srv.out}`)
  }
  return { command: `${tool} ${args.join(' ')} [server] / ... ${addr} [client]`, ...parsed }
}

/** Parses the result table of an ib_*_bw or ib_*_lat run. */
export function parse(output) {
  const lines = output.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const header = lines[i].trim()
    if (!header.startsWith('#bytes')) continue
    const names = header.match(/#\w+|[^\s[\]][^[\]]*?\[[^\]]*\]/g) ?? []
    for (let j = i + 1; j < lines.length; j++) {
      const values = lines[j].trim().split(/\s+/)
      if (!/^\d+$/.test(values[0] ?? '')) continue
      const row = {}
      names.forEach((n, k) => { row[n] = Number(values[k]) })
      if (row['BW average[MB/sec]'] !== undefined) {
        return { kind: 'bw', size: row['#bytes'], iters: row['#iterations'], mbPerSec: row['BW average[MB/sec]'], mpps: row['MsgRate[Mpps]'], peak: row['BW peak[MB/sec]'] }
      }
      if (row['t_typical[usec]'] !== undefined) {
        return {
          kind: 'lat', size: row['#bytes'], iters: row['#iterations'], tMin: row['t_min[usec]'], tMax: row['t_max[usec]'],
          tTypical: row['t_typical[usec]'], tAvg: row['t_avg[usec]'], p99: row['99% percentile[usec]'], p999: row['99.9% percentile[usec]'],
        }
      }
      return undefined
    }
  }
  return undefined
}
