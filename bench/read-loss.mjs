#!/usr/bin/env node
// RC READ under netem loss, perftest against this library, on the two-host
// topology (issue 11: "RC READ under 1% loss did not recover"). Both guests
// run this file; host 1 is the requester (it READs host 0's memory), host 0
// the responder. Every step puts the same netem on both egresses, then runs
// either ib_read_bw (one outstanding READ, -o 1, like a single qp.read) or
// one qp.read() of this library, and prints one READ-LOSS line per host with
// the wall time and the rxe port counters that moved (sent/received packets,
// completer retries, duplicate requests, ...).
//   bash scripts/softroce.sh run --topology two-host -- node bench/read-loss.mjs
// READ_LOSS_STEPS picks steps by index (comma separated), READ_LOSS_BOUND_MS
// bounds each step (default 300000).
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { Access, connect, decodeDescriptors, encodeDescriptors, listen, openDevice, remoteRegion, TransferAgent } from '../dist/index.js'
import { roceV2Ipv4GidIndex, run } from './perftest.mjs'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peer = process.env.SOFTROCE_PEER_ADDR
const device = process.env.SOFTROCE_DEVICE || 'rxe0'
const netdev = process.env.SOFTROCE_NETDEV || 'eth0'
const BOUND = Number(process.env.READ_LOSS_BOUND_MS || 300_000)
const KiB = 1024
const MiB = 1024 * KiB
if (role !== '0' && role !== '1') throw new Error('run through scripts/softroce.sh run --topology two-host')

// [tool, bytes per READ, READs, netem]
const ALL_STEPS = [
  ['perftest', 1 * MiB, 5, ['delay', '0ms']],
  ['library', 1 * MiB, 5, ['delay', '0ms']],
  ['perftest', 256 * KiB, 5, ['loss', '1%']],
  ['library', 256 * KiB, 5, ['loss', '1%']],
  ['perftest', 1 * MiB, 5, ['loss', '1%']],
  ['library', 1 * MiB, 5, ['loss', '1%']],
  ['perftest', 4 * MiB, 5, ['loss', '1%']],
  ['library', 4 * MiB, 1, ['loss', '1%']],
  // The transfer engine reads in 64 KiB slices over 2 QPs: a lost packet costs a slice, not the rest of the READ.
  ['transfer', 4 * MiB, 1, ['loss', '1%']],
  ['transfer', 16 * MiB, 1, ['loss', '1%']],
  // perftest with the retransmit timeout rdma_cm gave this library's QPs (19: 4.096 us * 2^19 = 2.1 s; perftest's own is 14).
  ['perftest', 1 * MiB, 5, ['loss', '1%'], ['-u', '19']],
  // netem's own queue holds 1000 packets by default; a responder bursting a 4 MiB READ (4096 packets)
  // overflows it and rxe fails to send (send_err). A large limit leaves only the wire loss.
  ['perftest', 4 * MiB, 5, ['loss', '1%', 'limit', '100000']],
  ['library', 4 * MiB, 1, ['loss', '1%', 'limit', '100000']],
  ['library', 16 * MiB, 1, ['loss', '1%']],
  // The requester's QP with ib_read_bw's retransmit timeout (connect({ ackTimeout: 14 }): 67 ms).
  ['library', 1 * MiB, 5, ['loss', '1%'], { ackTimeout: 14 }],
  ['library', 4 * MiB, 1, ['loss', '1%'], { ackTimeout: 14 }],
  ['library', 4 * MiB, 1, ['loss', '1%', 'limit', '100000'], { ackTimeout: 14 }],
]
const pick = process.env.READ_LOSS_STEPS?.split(',').map(Number)
const steps = ALL_STEPS.map((s, i) => [i, ...s]).filter(([i]) => !pick || pick.includes(i))

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const counterDir = `/sys/class/infiniband/${device}/ports/1/hw_counters`
function counters() {
  const out = {}
  for (const name of readdirSync(counterDir)) {
    try { out[name] = Number(readFileSync(`${counterDir}/${name}`, 'utf8')) } catch { /* unreadable */ }
  }
  return out
}
function moved(before, after) {
  return Object.fromEntries(Object.keys(after).filter((k) => after[k] !== before[k]).map((k) => [k, after[k] - before[k]]))
}
function netem(args) {
  execFileSync('tc', ['qdisc', 'replace', 'dev', netdev, 'root', 'netem', ...args], { stdio: 'pipe' })
}
const sha = (bytes) => createHash('sha256').update(bytes).digest('hex')
const gid = String(roceV2Ipv4GidIndex(device))

async function perftestStep(port, bytes, iters, extra = []) {
  const args = ['-d', device, '-x', gid, '-F', '-p', String(port), '-s', String(bytes), '-n', String(iters), '-o', '1', '-t', '1', ...extra]
  if (role === '0') return { out: (await run('ib_read_bw', args, BOUND)).out.slice(-300) }
  for (let attempt = 0; ; attempt++) {
    await sleep(1000)
    const start = performance.now()
    const r = await run('ib_read_bw', [...args, peer], BOUND)
    const ms = performance.now() - start
    if (/Couldn't connect|Unable to init the socket/.test(r.out) && attempt < 120) continue
    const completed = r.code === 0 && /BW average/.test(r.out)
    return { completed, ms: Math.round(ms), code: r.code, signal: r.signal, errors: completed ? undefined : r.out.split('\n').filter((l) => /error|fail|status/i.test(l)).slice(0, 5) }
  }
}

async function libraryStep(port, bytes, iters, connectOptions = {}) {
  const dev = openDevice(device)
  const pd = dev.allocPd()
  try {
    if (role === '0') {
      const listener = await listen({ host: local, port, pd })
      const request = await listener.accept()
      const region = pd.allocRegion(bytes, Access.LocalWrite | Access.RemoteRead)
      region.bytes.set(pattern(bytes))
      const conn = await request.accept({ privateData: encodeDescriptors([region.describe()]), timeoutMs: 60_000, receiveJson: true })
      // Host 1 sends the checksum of what it READ; host 0 compares it with its own.
      const answer = await conn.receiveJson({ timeoutMs: BOUND + 60_000 }).catch((e) => ({ error: e.code }))
      const same = answer.sha === sha(region.bytes)
      conn.close(); region.deregister(); listener.close()
      return { peerSaid: answer, shaMatches: same }
    }
    let conn
    for (let attempt = 0; ; attempt++) {
      try { conn = await connect({ host: peer, port, pd, timeoutMs: 30_000, receiveJson: true, ...connectOptions }); break } catch (e) {
        if (e.code !== 'ECONNREFUSED' || attempt > 240) throw e
        await sleep(500)
      }
    }
    const remote = remoteRegion(decodeDescriptors(conn.privateData)[0])
    const mine = pd.allocRegion(bytes, Access.LocalWrite)
    const q = conn.qp.query()
    const qpAttrs = { timeout: q.timeout, retryCount: q.retryCount, pathMtu: q.pathMtu, maxRdAtomic: q.maxRdAtomic }
    // `iters` READs one after the other, like ib_read_bw -o 1 -n iters; all of them within BOUND.
    const start = performance.now()
    const each = []
    let result
    try {
      for (let n = 0; n < iters; n++) {
        const t = performance.now()
        await conn.qp.read(mine.slice(0, bytes), remote.slice(0, bytes), { timeoutMs: Math.max(1, Math.round(BOUND - (t - start))) })
        each.push(Math.round(performance.now() - t))
      }
      result = { completed: true, ms: Math.round(performance.now() - start), each, qpAttrs }
    } catch (e) {
      result = { completed: false, ms: Math.round(performance.now() - start), each, qpAttrs, code: e.code, message: e.message }
    }
    await conn.sendJson(result.completed ? { sha: sha(mine.bytes) } : { error: result.code }).catch(() => {})
    await sleep(1000)
    conn.close()
    if (result.completed) mine.deregister()
    return result
  } finally {
    dev.close()
  }
}

const pattern = (bytes) => Uint8Array.from({ length: bytes }, (_, i) => (i * 31 + (i >>> 12)) & 0xff)

async function transferStep(port, bytes) {
  const agent = await TransferAgent.create({ host: local, port, name: `host${role}` })
  try {
    if (role === '0') {
      const src = agent.register('src', { size: bytes, remote: 'read' })
      src.bytes.set(pattern(bytes))
      // Host 1 notifies the checksum of what it read (or its error).
      const note = await new Promise((resolve) => {
        const timer = setTimeout(() => resolve({ error: 'no notification' }), BOUND + 60_000)
        agent.once('notification', ({ message }) => { clearTimeout(timer); resolve(JSON.parse(Buffer.from(message).toString())) })
      })
      return { peerSaid: note, shaMatches: note.sha === sha(src.bytes) }
    }
    const dst = agent.register('dst', { size: bytes })
    let peerHandle
    for (let attempt = 0; ; attempt++) {
      try { peerHandle = await agent.connect({ host: peer, port, timeoutMs: 30_000 }); break } catch (e) {
        if (attempt > 240) throw e
        await sleep(500)
      }
    }
    const start = performance.now()
    let result
    try {
      const r = await agent.read(peerHandle, [{ local: [dst, 0], remote: ['src', 0], length: bytes }], { timeoutMs: BOUND })
      result = { completed: true, ms: Math.round(performance.now() - start), workRequests: r.workRequests, qps: r.qps }
    } catch (e) {
      result = { completed: false, ms: Math.round(performance.now() - start), code: e.code, bytesLanded: e.bytesLanded, message: e.message }
    }
    await agent.notify(peerHandle, JSON.stringify(result.completed ? { sha: sha(dst.bytes) } : { error: result.code }), { timeoutMs: 60_000 }).catch(() => {})
    await sleep(2000)
    return result
  } finally {
    agent.close()
  }
}

for (const [i, tool, bytes, iters, net, extra] of steps) {
  netem(net)
  const before = counters()
  const port = 19600 + i
  let result
  try {
    result = tool === 'perftest' ? await perftestStep(port, bytes, iters, extra) : tool === 'transfer' ? await transferStep(port, bytes) : await libraryStep(port, bytes, iters, extra)
  } catch (e) {
    result = { error: e.stack }
  }
  console.log(`READ-LOSS ${JSON.stringify({ host: role, step: i, tool, bytes, reads: iters, netem: net.join(' '), ...(extra ? { extra: Array.isArray(extra) ? extra.join(' ') : extra } : {}), ...result, counters: moved(before, counters()) })}`)
}
try { execFileSync('tc', ['qdisc', 'del', 'dev', netdev, 'root'], { stdio: 'pipe' }) } catch { /* none */ }
// rxe logs a responder that could not send a READ response ("Failed sending RDMA reply").
try { console.log(`READ-LOSS-DMESG host ${role}: ${JSON.stringify(execFileSync('dmesg', { encoding: 'utf8' }).split('\n').filter((l) => /rxe|rdma/i.test(l)).slice(-20))}`) } catch { /* no dmesg */ }
process.exit(0)
