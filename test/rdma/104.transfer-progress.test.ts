// What a failed transfer says landed, and bounds by progress, against an
// agent in its own process: test/engine/peer-suite.ts with 'rdma' (unit/93
// runs it with 'tcp'), and what is RDMA's own: completions still in the CQ
// when the link closes count as landed.
import { describe, expect, it } from 'vitest'
import { TransferError, type Block } from '../../dist/index.js'
import { progressTests } from '../engine/peer-suite.js'
import { within } from '../engine/util.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const BLOCK = 4096
progressTests({ transport: 'rdma', host }, (ctx) => describe('landed blocks when the link closes (RDMA)', () => {
  it('RDMA: completions still in the CQ when the link closes count as landed (the transfer rejects after they are delivered)', async () => {
    const COUNT = 8192
    const { agent, expected } = ctx
    const dst = agent.register('closing', { size: COUNT * BLOCK })
    const remoteAt = (i: number): number => ((i * 4099) % COUNT) * BLOCK
    const blocks: Block[] = Array.from({ length: COUNT }, (_, i) => ({ local: [dst, i * BLOCK], remote: ['kv', remoteAt(i)], length: BLOCK }))
    let atClose = -1
    const outcome = await within(agent.read(ctx.peer, blocks, {
      onProgress: (confirmed) => {
        if (atClose >= 0) return
        atClose = confirmed
        // Busy for a while: the device completes the batches in flight into
        // the CQ, and nothing polls it. Then the link closes: closing its QPs
        // delivers those completions.
        const until = performance.now() + 100
        while (performance.now() < until) { /* busy */ }
        agent.closePeer(ctx.peer)
      },
    }).then(() => 'done', (e: unknown) => e), 60_000, 'the read to settle after closePeer')
    expect(outcome).toBeInstanceOf(TransferError)
    const error = outcome as TransferError
    expect(error.code).toBe('ERR_CLOSED')
    expect(error.bytesLanded, 'the completions delivered by the close were counted').toBeGreaterThan(atClose)
    for (let i = 0; i < COUNT; i++) {
      if (!error.blockLanded(i)) continue
      const at = remoteAt(i)
      if (Buffer.compare(dst.bytes.subarray(i * BLOCK, (i + 1) * BLOCK), expected.subarray(at, at + BLOCK)) !== 0) expect.fail(`block ${i} is reported landed but its bytes are not the peer's`)
    }
    expect(error.bytesLanded).toBe(error.blocksLanded * BLOCK)
    await agent.unregister(dst)
    ctx.peer = await agent.connect({ host, port: ctx.child.port, timeoutMs: 20_000 })
  }, 120_000)
}))
