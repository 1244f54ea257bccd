// Who may touch a segment over RDMA: test/engine/grants-suite.ts with 'rdma'
// (a type 2 memory window per peer's data QP; the region under it has no
// remote access). test/unit/100 runs the same suite over TCP.
import { grantsTests } from '../engine/grants-suite.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
grantsTests({ transport: 'rdma', host })
