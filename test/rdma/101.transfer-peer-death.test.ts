// The peer's process is killed mid-transfer: the transfer rejects within its
// bound with a coded error that says how many bytes landed; the next transfer
// fails fast while the peer is gone, and succeeds on fresh QPs once it is back
// (test/engine/peer-suite.ts, here with 'rdma'; test/unit/93 runs it with 'tcp');
// then agent.resume() after a restart, a kill and a dropped link (test/engine/resume-suite.ts).
import { peerDeathTests } from '../engine/peer-suite.js'
import { resumeTests } from '../engine/resume-suite.js'

peerDeathTests({ transport: 'rdma', host: process.env.SOFTROCE_ADDR ?? '198.18.0.1' })
resumeTests({ transport: 'rdma', host: process.env.SOFTROCE_ADDR ?? '198.18.0.1' })
