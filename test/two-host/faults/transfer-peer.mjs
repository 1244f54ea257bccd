// The transfer-engine peer that the campaign kills with SIGKILL and starts
// again (host 1, in its own process): an agent listening on HOST:PORT with a
// read-write segment 'kv' of 8 MiB (zeros). Prints "listening"; exits when stdin closes.
import { TransferAgent } from 'node-ibverbs'

const [host, port, generation] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])]
const agent = await TransferAgent.create({ host, port, name: `transfer-peer-${generation}`, qpsPerPeer: 2, ackTimeout: 14 })
agent.register('kv', { size: 8 << 20, remote: 'read-write' })
console.log(`listening ${process.pid}`)
process.stdin.resume()
process.stdin.on('end', () => { agent.close(); process.exit(0) })
