// Who may touch a segment over TCP on loopback: test/engine/grants-suite.ts
// with 'tcp' (test/rdma/109 runs it with 'rdma', where the NIC enforces it).
import { grantsTests } from '../engine/grants-suite.js'

grantsTests({ transport: 'tcp', host: '127.0.0.1' })
