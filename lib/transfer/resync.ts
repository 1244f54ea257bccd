// What a new link's peer must hear after the handshake: the local table
// changed between the handshake's snapshot (sent in the handshake) and the
// link's adoption (from then on every change is broadcast), so the
// difference goes out as table messages that each fit a control message.
import { tableMessages, type ControlMessage } from './control.js'
import type { Link } from './link.js'
import type { LocalTable, SegmentEntry } from './segments.js'

/** Withdrawals of the names gone since `sent`, then the entries new or changed since, in chunks. */
export function tableChanges(sent: readonly SegmentEntry[], now: readonly SegmentEntry[], version: number): ControlMessage[] {
  const before = new Map(sent.map((entry) => [entry[0], entry]))
  const names = new Set(now.map((entry) => entry[0]))
  const messages: ControlMessage[] = []
  for (const name of before.keys()) if (!names.has(name)) messages.push({ t: 'del', v: version, name })
  const changed = now.filter((entry) => {
    const old = before.get(entry[0])
    return old === undefined || old.some((field, i) => field !== entry[i])
  })
  if (changed.length > 0) messages.push(...tableMessages(changed, version))
  return messages
}

/** Sends `link`'s peer what changed in the local table since the handshake's snapshot (a send that fails fails the link). */
export function resync(link: Link, table: LocalTable): void {
  if (link.sentTable.version === table.version) return
  for (const message of tableChanges(link.sentTable.entries, table.entries(), table.version)) link.broadcast(message)
}
