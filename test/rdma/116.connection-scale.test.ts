// A thousand rdma_cm connections in one process, both ends (listener and
// clients on one PD): each one answers a message, and the process's fds do
// not grow with them, because a device context's CQs share one completion
// channel and every cm id shares the one event channel. Prints fds and RSS
// per connection (docs/reliability.md, "Limits").
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { readdirSync } from 'node:fs'
import { connect, listen, type Connection, type Device, type Listener, type ProtectionDomain } from '../../dist/index.js'
import { testDevice } from './helpers.js'

const host = process.env.SOFTROCE_ADDR ?? '198.18.0.1'
const CONNECTIONS = 1000
const WAVE = 50
const small = { qp: { maxSendWr: 8, maxRecvWr: 8 }, cqOptions: { entries: 32 } }
const fds = () => readdirSync('/proc/self/fd').length - 1
const rssMiB = () => process.memoryUsage().rss / 2 ** 20

let device: Device
let pd: ProtectionDomain
let listener: Listener
const served: Connection[] = []

beforeAll(async () => {
  device = testDevice()
  pd = device.allocPd()
  listener = await listen({ host, port: 0, pd, backlog: 256 })
  listener.on('request', (request) => {
    request.accept({ ...small, receiveJson: true }).then(async (conn) => {
      served.push(conn)
      conn.on('disconnected', () => conn.close())
      const message = await conn.receiveJson() as { echo: number }
      await conn.sendJson({ echo: message.echo })
    }).catch(() => { /* counted by the client side's checks */ })
  })
})
afterAll(() => {
  listener?.close()
  device?.close()
})

describe('connection scale', () => {
  it(`${CONNECTIONS} connections on one PD: each answers, fds stay flat, all close`, async () => {
    const fdsBefore = fds()
    const rssBefore = rssMiB()
    const clients: Connection[] = []
    for (let wave = 0; wave < CONNECTIONS / WAVE; wave++) {
      clients.push(...await Promise.all(Array.from({ length: WAVE }, () =>
        connect({ host, port: listener.address!.port, pd, receiveJson: true, timeoutMs: 60_000, ...small }))))
    }
    const replies = await Promise.all(clients.map(async (conn, i) => {
      await conn.sendJson({ echo: i })
      return ((await conn.receiveJson({ timeoutMs: 60_000 })) as { echo: number }).echo
    }))
    expect(replies).toEqual(clients.map((_, i) => i))
    expect(new Set(clients.map((c) => c.qp.qpn)).size).toBe(CONNECTIONS)
    expect(served.length).toBe(CONNECTIONS)
    const grown = fds() - fdsBefore
    const rss = rssMiB() - rssBefore
    console.log(`${CONNECTIONS} connections (both ends in this process, ${2 * CONNECTIONS} QPs and CQs): fds +${grown}, RSS +${rss.toFixed(1)} MiB (${(rss * 1024 / CONNECTIONS).toFixed(1)} KiB per connection)`)
    // One completion channel fd per CQ made this +2000.
    expect(grown).toBeLessThan(16)
    await Promise.all(clients.map((c) => c.disconnect()))
    expect(clients.every((c) => c.closed)).toBe(true)
    for (let i = 0; i < 100 && served.some((c) => !c.closed); i++) await new Promise((resolve) => setTimeout(resolve, 50))
    expect(served.every((c) => c.closed)).toBe(true)
  }, 900_000)
})
