// A link's control channel failing a send: the table change it carried never
// reaches the peer, so the link must not go on as if healthy. And the count
// of a link's batches in flight that a peer's withdrawal waits for. The
// channel and lane here are stand-ins of the ControlChannel and Lane
// interfaces; no verbs are involved. The engine suites prove the paths on
// both transports (test/engine/transfer-suite.ts: resync in chunks, a
// withdrawal racing posted batches).
import { describe, expect, it } from 'vitest'
import { RdmaError } from '../../lib/core/errors.js'
import { Link } from '../../lib/transfer/link.js'
import { ControlInbox, type ControlChannel } from '../../lib/transfer/control.js'
import { RemoteTable } from '../../lib/transfer/segments.js'
import { BatchTracker } from '../../lib/transfer/drain.js'
import type { Lane } from '../../lib/transfer/poster.js'
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
    const link = new Link(channel, new ControlInbox(channel), [], new RemoteTable(), 'peer-id', 'peer', 16)
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
    const link = new Link(channel, new ControlInbox(channel), [], new RemoteTable(), 'peer-id', 'peer', 16)
    link.broadcast({ t: 'add', v: 3, seg: [], end: true })
    await new Promise((resolve) => setImmediate(resolve))
    expect(link.healthy).toBe(false)
    expect(link.error).toMatchObject({ code: 'ERR_CONTROL_SEND' })
  })
})

describe("a link's batches in flight (drain.ts): what a peer's withdrawal waits for", () => {
  it('drained() resolves once the batches posted before it settled (completed or failed), not waiting for later ones', async () => {
    const settle: Array<{ resolve: () => void; reject: (e: Error) => void }> = []
    const lane: Lane = {
      depth: 16,
      broken: false,
      post: () => new Promise<void>((resolve, reject) => { settle.push({ resolve, reject }) }),
      close: () => undefined,
    }
    const tracker = new BatchTracker()
    const wrapped = tracker.wrap(lane)
    const plan = {} as CheckedPlan
    let early = false
    await tracker.drained().then(() => { early = true })
    expect(early, 'nothing in flight: at once').toBe(true)
    const first = wrapped.post(plan, 0, 1, [])
    const second = wrapped.post(plan, 1, 2, []).catch(() => undefined)
    let drained = false
    void tracker.drained().then(() => { drained = true })
    const later = wrapped.post(plan, 2, 3, [])
    const tick = () => new Promise((resolve) => setImmediate(resolve))
    settle[1]!.reject(new Error('refused'))
    await tick()
    expect(drained, 'the first batch is still in flight').toBe(false)
    settle[0]!.resolve()
    await Promise.all([first, second])
    await tick()
    expect(drained, 'both earlier batches settled; the later one does not count').toBe(true)
    settle[2]!.resolve()
    await later
  })
})
