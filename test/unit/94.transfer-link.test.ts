// A link's control channel failing a send: the table change it carried never
// reaches the peer, so the link must not go on as if healthy. The channel
// here is a stand-in of the ControlChannel interface (sends are refused); no
// verbs are involved. The engine suites prove the paths that do send
// (test/engine/transfer-suite.ts: resync in chunks).
import { describe, expect, it } from 'vitest'
import { RdmaError } from '../../lib/core/errors.js'
import { Link } from '../../lib/transfer/link.js'
import { ControlInbox, type ControlChannel } from '../../lib/transfer/control.js'
import { RemoteTable } from '../../lib/transfer/segments.js'

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
