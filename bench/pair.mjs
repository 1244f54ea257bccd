// Two RC queue pairs on one device, connected to each other, each with a
// small region: the setup of the profiling scripts.
import { Access } from '../dist/index.js'
import { SendFlags, WrOpcode } from '../dist/core/constants.js'
import { WorkRequestEncoder } from '../dist/ops/encoder.js'

const ACCESS = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic

/** { c, s }: client and server sides, each { cq, qp, mr }, on one PD of `device`; `cqOptions`: more options for both CQs. */
export async function connectedPair(device, pollMode, cqOptions = {}) {
  const pd = device.allocPd()
  const side = () => {
    const cq = device.createCq({ entries: 1024, pollMode, ...cqOptions })
    const qp = pd.createQp({ type: 'RC', sendCq: cq, maxSendWr: 128, maxRecvWr: 128 })
    const mr = pd.allocRegion(4096, ACCESS)
    return { cq, qp, mr }
  }
  const c = side(), s = side()
  await c.qp.connect(s.qp.endpoint())
  await s.qp.connect(c.qp.endpoint())
  return { c, s }
}

/**
 * `run(n)`: n tagged 8-byte READs from `c` to `s`, each followed by
 * `cq.poll()` until it is reported (the C loop's shape); `run.polls` counts
 * the polls. Sets c's completion handler.
 */
export function taggedReadLoop({ c, s }) {
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  let reported = false
  c.qp.setCompletionHandler((tag, error) => { if (error) throw error; reported = true })
  const run = (n) => {
    for (let i = 0; i < n; i++) {
      reported = false
      c.qp.postRead(local, remote, i)
      while (!reported) { c.cq.poll(); run.polls++ }
    }
  }
  run.polls = 0
  return run
}

/**
 * `run(n)`: n 8-byte READs through the addon's bound post and poll alone (no
 * library JS per request: Node's floor). Posts wr_ids the library does not
 * track: use the pair for nothing else.
 */
export function rawReadLoop({ c, s }) {
  const local = c.mr.slice(0, 8), remote = s.mr.asRemote().slice(0, 8)
  const enc = new WorkRequestEncoder()
  const post = c.qp.handle.sendPoster(enc.buffer, c.cq.handle)
  const poll = c.cq.handle.poller()
  let wrId = 2e9
  return (n) => {
    for (let i = 0; i < n; i++) {
      enc.reset()
      enc.addOne(wrId++, WrOpcode.RdmaRead, SendFlags.Signaled, local.address, 8, local.lkey, remote.addrLo, remote.addrHi, remote.rkey, 0)
      if (post(0, 1, 1) > 0) continue
      while (poll() === 0);
    }
  }
}
