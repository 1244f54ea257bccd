// register()'s `peers` and the peer names grant() and revoke() take, checked.
import { typeError } from '../core/validate.js'
import type { SegmentPeers } from './segments.js'

/** A peer name a grant can hold: what an agent's `name` may be (1..128 characters). */
export function isGrantName(value: unknown): value is string {
  return typeof value === 'string' && value.length > 0 && value.length <= 128
}

/** options.peers: undefined (shared by every peer), 'any', or a list of peer names. */
export function checkPeers(value: unknown): SegmentPeers | undefined {
  if (value === undefined || value === 'any') return value
  if (!Array.isArray(value)) throw typeError(`'any' or a list of peer names`, 'options.peers', value)
  value.forEach((name, i) => { if (!isGrantName(name)) throw typeError('a peer name of 1..128 characters', `options.peers[${i}]`, name) })
  return [...value] as string[]
}
