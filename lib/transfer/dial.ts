// Dialing a peer found by name: its record lists one address per rail
// (metadata/record.ts), rail 0's first. They are tried in order, so that a
// peer whose rail 0 is unreachable from here (its wire down) is still reached
// over another rail; each attempt gets an equal share of what is left of the
// bound, so a first address that never answers leaves time for the others.
import { RdmaError } from '../core/errors.js'
import type { PeerAddress, PeerRecord } from './metadata/index.js'

/** Errors that are the peer's answer, not its address's silence: another address would give the same. */
const FINAL = new Set(['ERR_STALE_PEER', 'ERR_PEER_REFUSED', 'ERR_TRANSFER_PROTOCOL', 'ERR_CLOSED', 'ABORT_ERR'])

/**
 * The first link `connect` makes to one of `record`'s addresses, in order,
 * within `timeoutMs` in all. An answer that is final (ERR_STALE_PEER, a
 * refusal, an abort) ends it at once. When none answers: a record of one
 * address rejects with that address's error, as before rails; else with
 * ERR_PEER_UNREACHABLE, naming every address tried and why.
 */
export async function dialAddresses<L>(record: PeerRecord, timeoutMs: number, connect: (address: PeerAddress, timeoutMs: number) => Promise<L>): Promise<L> {
  const addresses = record.addresses
  if (addresses.length === 0) throw new RdmaError(`The record of '${record.name}' has no address`, { code: 'ERR_METADATA_RECORD' })
  const deadline = Date.now() + timeoutMs
  const tried: string[] = []
  let last: unknown
  for (let i = 0; i < addresses.length; i++) {
    const left = deadline - Date.now()
    if (i > 0 && left <= 0) break
    const address = addresses[i]!
    const share = Math.max(1, Math.floor(left / (addresses.length - i)))
    try {
      return await connect(address, share)
    } catch (error) {
      const code = (error as RdmaError)?.code
      if (addresses.length === 1 || (code !== undefined && FINAL.has(code))) throw error
      last = error
      tried.push(`${address.host}:${address.port} (${address.device}): ${code ?? (error as Error)?.message}`)
    }
  }
  const untried = addresses.length - tried.length
  throw new RdmaError(`No address of peer '${record.name}' answered within ${timeoutMs} ms: ${tried.join('; ')}${untried > 0 ? `; ${untried} not tried (the bound was reached)` : ''}`,
    { code: 'ERR_PEER_UNREACHABLE', cause: last })
}
