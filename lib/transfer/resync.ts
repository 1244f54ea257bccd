// What a link's peer hears of the local table: after the handshake, what
// changed between the handshake's snapshot (sent in the handshake) and the
// link's adoption, as table messages that each fit a control message; from
// then on each change (announce()). A per-peer segment goes only to the
// peers it is granted to, with that link's keys.
import { tableMessages, type ControlMessage } from './control.js'
import type { Link } from './link.js'
import type { LocalTable, Segment, SegmentEntry } from './segments.js'

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
  const version = table.version
  void link.sendTable(async () => tableChanges(link.sentTable.entries, await table.entriesFor(link.peerName, (s, name) => link.grants.grant(s, name)), version))
}

/** Tells `link`'s peer of a new segment, if it may see it (a per-peer one is granted on the link first). */
export function announce(link: Link, segment: Segment, version: number): void {
  if (!segment.grants) return void link.sendTable(() => [{ t: 'add', v: version, seg: [segment.entry()], end: true }])
  if (!segment.grants.allows(link.peerName)) return
  void link.sendTable(async () => {
    if (segment.withdrawn || !segment.grants!.allows(link.peerName)) return []
    let keys: number[] | undefined
    try {
      keys = await link.grants.grant(segment, link.peerName)
    } catch (error) {
      if (segment.withdrawn || !segment.grants!.allows(link.peerName)) return [] // unregistered or revoked meanwhile
      throw error
    }
    return segment.withdrawn ? [] : [{ t: 'add', v: version, seg: [segment.entry(keys)], end: true }]
  })
}
