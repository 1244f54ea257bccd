// Two RC queue pairs on one device, connected to each other, each with a
// small region: the setup of the profiling scripts.
import { Access } from '../dist/index.js'

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
