// The peer that test/two-host/30.faults kills with SIGKILL and starts again
// (host 1, in its own process): listens on HOST:PORT, gives every connection
// an 8 MiB region, greets it with { generation }, and answers
// { check: [offset, length] } with the sha256 of those bytes and whether
// every other byte of the region is still zero. Prints "listening"; exits when stdin closes.
import { createHash } from 'node:crypto'
import { Access, encodeDescriptors, listen, openDevice } from 'node-ibverbs'

const [host, port, generation] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])]
const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const pd = device.allocPd()
const listener = await listen({ host, port, pd })
listener.on('request', async (request) => {
  const region = pd.allocRegion(8 << 20, Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead | Access.RemoteAtomic)
  try {
    const conn = await request.accept({ privateData: encodeDescriptors([region.describe()]), receiveJson: true })
    conn.on('disconnected', () => { conn.close(); region.deregister() })
    await conn.sendJson({ generation })
    for (;;) {
      const message = await conn.receiveJson()
      const [offset, length] = message.check
      const sha = createHash('sha256').update(region.bytes.subarray(offset, offset + length)).digest('hex')
      const elsewhere = [region.bytes.subarray(0, offset), region.bytes.subarray(offset + length)]
      await conn.sendJson({ sha, untouched: elsewhere.every((part) => part.every((byte) => byte === 0)) })
    }
  } catch (error) {
    if (error.code !== 'ERR_CLOSED' && error.code !== 'WR_FLUSH_ERR') console.error(`peer-server: ${error.message}`)
  }
})
console.log(`listening ${process.pid}`)
process.stdin.resume()
process.stdin.on('end', () => { listener.close(); device.close(); process.exit(0) })
