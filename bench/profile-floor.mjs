// Floor of the architecture: native postSend + poll without the promise layer.
//   node bench/profile-floor.mjs [--n 2000]
import { performance } from 'node:perf_hooks'
import { openDevice } from '../dist/index.js'
import { connectedPair } from './pair.mjs'
import { WorkRequestEncoder } from '../dist/ops/encoder.js'
import { WrOpcode, SendFlags } from '../dist/core/constants.js'

const args = process.argv.slice(2)
const n = Number(args[args.indexOf('--n') + 1] || 2000)
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const { c, s } = await connectedPair(device, 'busy')
const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
const enc = new WorkRequestEncoder()
let wrId = 1e6
const post = (opcode) => {
  enc.reset()
  enc.addSend({ wrId: wrId++, opcode, flags: SendFlags.Signaled, sges: [{ address: local.address, length: 8, lkey: local.lkey }], remoteHi: remote.addrHi, remoteLo: remote.addrLo, rkey: remote.rkey, compareAdd: opcode === WrOpcode.AtomicFetchAndAdd ? 1n : undefined })
  c.qp.handle.postSend(enc.buffer, enc.count)
}
let t = performance.now(); for (let i = 0; i < 10000; i++) performance.now(); console.log(`performance.now: ${((performance.now() - t) / 10).toFixed(3)} µs/call`)
t = performance.now(); for (let i = 0; i < 10000; i++) c.cq.handle.poll(); console.log(`empty poll(): ${((performance.now() - t) / 10).toFixed(3)} µs/call`)
t = performance.now(); for (let i = 0; i < 2000; i++) await new Promise((r) => setImmediate(r)); console.log(`setImmediate turn: ${((performance.now() - t) / 2).toFixed(3)} µs`)
t = performance.now(); for (let i = 0; i < 20000; i++) await new Promise((r) => r()); console.log(`promise await: ${((performance.now() - t) / 20).toFixed(3)} µs`)
for (const [name, opcode] of [['read', WrOpcode.RdmaRead], ['write', WrOpcode.RdmaWrite], ['fadd', WrOpcode.AtomicFetchAndAdd]]) {
  // sync spin
  let polls = 0, postT = 0
  t = performance.now()
  for (let i = 0; i < n; i++) {
    const a = performance.now(); post(opcode); postT += performance.now() - a
    for (;;) { polls++; if (c.cq.handle.poll() > 0) break }
  }
  let dt = performance.now() - t
  console.log(`${name} sync-spin: ${(dt * 1000 / n).toFixed(1)} µs/op, postSend ${(postT * 1000 / n).toFixed(1)} µs, ${(polls / n).toFixed(1)} polls/op`)
  // spin with setImmediate between polls
  polls = 0
  t = performance.now()
  for (let i = 0; i < n; i++) {
    post(opcode)
    for (;;) { polls++; if (c.cq.handle.poll() > 0) break; await new Promise((r) => setImmediate(r)) }
  }
  dt = performance.now() - t
  console.log(`${name} immediate-spin: ${(dt * 1000 / n).toFixed(1)} µs/op, ${(polls / n).toFixed(1)} polls/op`)
}
device.close()
