// Median per-op time of: the raw native floor (postSend + poll), and qp.read()/fetchAndAdd() (event, busy).
import { performance } from 'node:perf_hooks'
import { openDevice } from '../dist/index.js'
import { connectedPair } from './pair.mjs'
import { WorkRequestEncoder } from '../dist/ops/encoder.js'
import { WrOpcode, SendFlags } from '../dist/core/constants.js'
const n = Number(process.argv[2] || 1000)
const med = (a) => { const s = Float64Array.from(a).sort(); return s[s.length >> 1] }
for (const mode of ['event', 'busy']) {
  const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
  const { c, s } = await connectedPair(device, mode)
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const enc = new WorkRequestEncoder()
  let wrId = 1e9
  const t = new Float64Array(n), tp = new Float64Array(n)
  if (mode === 'event') {
    for (let i = 0; i < n; i++) {
      const t0 = performance.now()
      enc.reset(); enc.addSend({ wrId: wrId++, opcode: WrOpcode.RdmaRead, flags: SendFlags.Signaled, sges: [{ address: local.address, length: 8, lkey: local.lkey }], remoteHi: remote.addrHi, remoteLo: remote.addrLo, rkey: remote.rkey })
      c.qp.handle.postSend(enc.buffer, enc.count)
      const t1 = performance.now()
      while (c.cq.handle.poll() === 0);
      t[i] = (performance.now() - t0) * 1000; tp[i] = (t1 - t0) * 1000
    }
    console.log(`floor read: median ${med(t).toFixed(1)} µs (postSend incl. encode ${med(tp).toFixed(1)} µs)`)
  }
  for (const [name, fn] of [['read', () => c.qp.read(local, remote)], ['write', () => c.qp.write(local, remote)], ['fadd', () => c.qp.fetchAndAdd(remote, 1n)]]) {
    for (let i = 0; i < 100; i++) await fn()
    for (let i = 0; i < n; i++) { const t0 = performance.now(); await fn(); t[i] = (performance.now() - t0) * 1000 }
    console.log(`${name} ${mode}: median ${med(t).toFixed(1)} µs`)
  }
  device.close()
}
