// A link's control channel failing a send: the table change it carried never
// reaches the peer, so the link must not go on as if healthy. And the count
// of a link's batches in flight that a peer's withdrawal waits for (per
// poster: a lane settles its batches in posting order). The
// channel and lane here are stand-ins of the ControlChannel and Lane
// interfaces; no verbs are involved. The engine suites prove the paths on
// both transports (test/engine/transfer-suite.ts: resync in chunks, a
// withdrawal racing posted batches).
import { describe, expect, it } from 'vitest'
import { RdmaError } from '../../lib/core/errors.js'
import { Link } from '../../lib/transfer/link.js'
import { ControlInbox, type ControlChannel } from '../../lib/transfer/control.js'
import { RemoteTable } from '../../lib/transfer/segments.js'
import { KeyGrants } from '../../lib/transfer/grants.js'
import { QpPoster, type Lane, type PostSource } from '../../lib/transfer/poster.js'
import type { CheckedPlan } from '../../lib/transfer/plan.js'

function refusingChannel(): ControlChannel & { closed: boolean } {
  return {
    closed: false,
    sendJson: () => Promise.reject(new RdmaError('JSON message of 5000 bytes is over 4096', { code: 'ERR_MESSAGE_TOO_LARGE' })),
    receiveJson: () => new Promise(() => undefined),
    on: () => undefined,
    close() { this.closed = true },
  }
}

describe('a table change that cannot be sent fails the link', () => {
  it('after listen(): the failure goes to the link\'s failure listener with ERR_CONTROL_SEND, the cause kept', async () => {
    const channel = refusingChannel()
    const link = new Link(channel, new ControlInbox(channel), [], new RemoteTable(), new KeyGrants(), 'peer-id', 'peer', 16)
    const failures: RdmaError[] = []
    link.listen(() => undefined, (error) => { failures.push(error as RdmaError); link.fail(error as RdmaError) })
    link.broadcast({ t: 'del', v: 2, name: 'kv' })
    await new Promise((resolve) => setImmediate(resolve))
    expect(failures).toHaveLength(1)
    expect(failures[0]).toMatchObject({ code: 'ERR_CONTROL_SEND' })
    expect((failures[0]!.cause as RdmaError).code).toBe('ERR_MESSAGE_TOO_LARGE')
    expect(link.healthy).toBe(false)
    expect(channel.closed).toBe(true)
  })

  it('before listen() (the resync right after the handshake): the link fails by itself', async () => {
    const channel = refusingChannel()
    const link = new Link(channel, new ControlInbox(channel), [], new RemoteTable(), new KeyGrants(), 'peer-id', 'peer', 16)
    link.broadcast({ t: 'add', v: 3, seg: [], end: true })
    await new Promise((resolve) => setImmediate(resolve))
    expect(link.healthy).toBe(false)
    expect(link.error).toMatchObject({ code: 'ERR_CONTROL_SEND' })
  })
})

describe("a link's batches in flight (QpPoster.drained): what a peer's withdrawal waits for", () => {
  it('drained() resolves once the batches posted before it settled (completed or failed), not waiting for later ones', async () => {
    const settle: Array<{ resolve: () => void; reject: (e: Error) => void }> = []
    const lane: Lane = {
      rail: 0,
      depth: 16,
      broken: false,
      post: () => new Promise<void>((resolve, reject) => { settle.push({ resolve, reject }) }),
      close: () => undefined,
    }
    const plan = {} as CheckedPlan
    // A transfer of `batches` one-slice batches, posted one per pump.
    const source = (batches: number): PostSource => {
      let next = 0
      return {
        settled: false,
        hasMore: () => next < batches,
        postNext: (q, _max, l) => { const from = next++; return { wrs: 1, bytes: 1, slots: 1, from, to: from + 1, rail: l.rail, q, done: l.post(plan, from, from + 1, []) } },
        batchDone: () => undefined,
        batchFailed: () => undefined,
      }
    }
    const poster = new QpPoster(lane, 0, 1)
    let early = false
    await poster.drained().then(() => { early = true })
    expect(early, 'nothing in flight: at once').toBe(true)
    poster.add(source(2))
    let drained = false
    void poster.drained().then(() => { drained = true })
    poster.add(source(1))
    expect(settle).toHaveLength(3)
    const tick = () => new Promise((resolve) => setImmediate(resolve))
    settle[0]!.resolve()
    await tick()
    expect(drained, 'the second batch is still in flight').toBe(false)
    settle[1]!.reject(new Error('refused'))
    await tick()
    expect(drained, 'both earlier batches settled; the later one does not count').toBe(true)
    settle[2]!.resolve()
  })
})
