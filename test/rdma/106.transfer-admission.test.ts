// Who may connect, over RDMA: test/engine/admission-suite.ts with 'rdma'
// (test/unit/99 runs it with 'tcp'), its hand-made client an rdma_cm
// connection with the protocol tag and a data QP of its own.
import { afterAll } from 'vitest'
import { connect } from '../../dist/index.js'
import { admissionTests } from '../engine/admission-suite.js'
import { testDevice } from './helpers.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const device = testDevice()
afterAll(() => device.close())

admissionTests({ transport: 'rdma', host }, async (port) => {
  const pd = device.allocPd()
  const cq = device.createCq()
  const qp = pd.createQp({ type: 'RC', sendCq: cq })
  const conn = await connect({ host, port, pd, timeoutMs: 5000, privateData: Buffer.from('NIBT2'), receiveJson: true })
  return {
    channel: conn,
    hello: { t: 'hello', p: 2, qps: [qp.endpoint()] },
    close: () => { conn.close(); qp.close(); cq.close() },
  }
})
