// The transfer engine under a fault: host 1's agent WRITEs random blocks into
// host 0's segment with a notification, and host 0 checks every block once the
// notification is there; then host 1 READs random blocks of host 0's segment
// back and checks every one. Each side knows the other's bytes (patterns from
// the round's seed), so each checks what it received block by block.
import { TransferAgent, TransferError, type Block, type Peer, type Segment } from '../../../dist/index.js'
import { pattern, scatter, within } from '../../rdma/helpers.js'
import type { Control } from './control.js'
import { ACK_TIMEOUT, local, peer as peerHost, role } from './session.js'
import { clearNetem, flapLink, netem } from './wire.js'

const PORT = 7486
const SEGMENT = 'faults'

export interface TransferRound {
  /** Bytes written, and read back. */
  bytes: number
  seed: number
  /** Also READ (default true): READ under loss is slow on rxe, see docs/reliability.md. */
  read?: boolean
  /** Bound on each transfer. */
  timeoutMs: number
}

export interface TransferRoundResult {
  blocks: number
  workRequests: number
  writeMBps: number
  readMBps: number
  bytesVerified: number
  problems: string[]
}

/** Both hosts' agents for the session: host 0 listens, host 1 connects (once; a broken link reconnects on its next transfer). */
export interface TransferSession { agent: TransferAgent; segment: Segment; peer: Peer | undefined; close(): void }

/** Host 0's segment: [0, bytes) READ source, [bytes, 2 bytes) WRITE target. Host 1's: WRITE source, READ target. */
export async function openTransfer(control: Control, maxBytes: number): Promise<TransferSession> {
  const agent = await TransferAgent.create({ host: local, port: role === '0' ? PORT : 0, name: `faults-${role}`, qpsPerPeer: 2, ackTimeout: ACK_TIMEOUT })
  const segment = agent.register(SEGMENT, { size: 2 * maxBytes, remote: role === '0' ? 'read-write' : 'none' })
  const session: TransferSession = { agent, segment, peer: undefined, close: () => agent.close() }
  try {
    if (role === '0') {
      control.send({ type: 'agent-listening' })
      await control.expect('agent-connected', 120_000)
      return session
    }
    await control.expect('agent-listening', 120_000)
    for (let attempt = 0; !session.peer; attempt++) {
      try {
        session.peer = await agent.connect({ host: peerHost, port: PORT, timeoutMs: 30_000 })
      } catch (error) {
        if (attempt >= 60) throw error
        await new Promise((resolve) => setTimeout(resolve, 500))
      }
    }
    control.send({ type: 'agent-connected' })
    return session
  } catch (error) {
    agent.close()
    throw error
  }
}


/** Indexes of the pieces whose bytes at `base + dst` are not `source[src..]`. */
function wrongPieces(bytes: Uint8Array, base: number, source: Uint8Array, pieces: ReturnType<typeof scatter>): number[] {
  const wrong: number[] = []
  pieces.forEach((p, i) => {
    if (Buffer.compare(bytes.subarray(base + p.dst, base + p.dst + p.length), source.subarray(p.src, p.src + p.length)) !== 0) wrong.push(i)
  })
  return wrong
}

const mbps = (bytes: number, ms: number) => Math.round((bytes / 1048576 / (ms / 1000)) * 100) / 100

/** One round with netem `args` on both egresses (none: a clean wire). */
export async function netemTransferRound(t: TransferSession, control: Control, args: string[] | undefined, round: TransferRound): Promise<TransferRoundResult> {
  if (args) netem(args)
  try {
    return role === '0' ? await passive(t, control, round) : await active(t, control, round)
  } finally {
    if (args) clearNetem()
  }
}

async function passive(t: TransferSession, control: Control, round: TransferRound): Promise<TransferRoundResult> {
  const { bytes, seed, timeoutMs } = round
  const view = t.segment.bytes
  view.set(pattern(bytes, seed), 0)
  view.fill(0, bytes, 2 * bytes)
  const notified = new Promise<unknown>((resolve) => {
    const on = (n: { message: unknown }) => { if (n.message === `round ${seed}`) { t.agent.off('notification', on); resolve(n.message) } }
    t.agent.on('notification', on)
  })
  control.send({ type: 'transfer-ready' })
  const written = await control.expect('transfer-written', timeoutMs + 60_000)
  const problems: string[] = []
  const pieces = scatter(bytes, seed + 1, 16)
  let bytesVerified = 0
  if (written.ok) {
    // The notification comes after the data; the write resolved after it was acknowledged.
    await within(notified, 60_000, 'the notification').catch(() => problems.push('the write resolved but its notification never came'))
    const wrong = wrongPieces(view, bytes, pattern(bytes, seed + 1), pieces)
    if (wrong.length) problems.push(`${wrong.length} of ${pieces.length} written blocks hold other bytes (first: ${wrong[0]})`)
    else bytesVerified += bytes
  }
  control.send({ type: 'transfer-verified', problems })
  const done = await control.expect('transfer-done', timeoutMs + 60_000)
  return { blocks: pieces.length, workRequests: 0, writeMBps: NaN, readMBps: NaN, bytesVerified, problems: [...problems, ...(done.problems as string[]).map((p) => `host 1: ${p}`)] }
}

async function active(t: TransferSession, control: Control, round: TransferRound): Promise<TransferRoundResult> {
  const { bytes, seed, timeoutMs } = round
  const view = t.segment.bytes
  const source = pattern(bytes, seed + 1)
  view.set(source, 0)
  view.fill(0, bytes, 2 * bytes)
  await control.expect('transfer-ready', timeoutMs)
  const problems: string[] = []
  const pieces = scatter(bytes, seed + 1, 16)
  const writes: Block[] = pieces.map((p) => ({ local: [t.segment, p.src], remote: [SEGMENT, bytes + p.dst], length: p.length }))
  let workRequests = 0
  let writeMBps = NaN
  let readMBps = NaN
  let bytesVerified = 0
  try {
    const result = await t.agent.write(t.peer!, writes, { notify: `round ${seed}`, timeoutMs })
    workRequests += result.workRequests
    writeMBps = mbps(bytes, result.ms)
    control.send({ type: 'transfer-written', ok: true })
  } catch (error) {
    problems.push(`write rejected: ${(error as { code?: string }).code ?? ''} ${(error as Error).message}`)
    control.send({ type: 'transfer-written', ok: false })
  }
  const verified = await control.expect('transfer-verified', timeoutMs + 120_000)
  problems.push(...(verified.problems as string[]).map((p) => `host 0: ${p}`))
  if (!(verified.problems as string[]).length && !problems.length) bytesVerified += bytes
  if (round.read !== false) {
    const back = scatter(bytes, seed + 2, 16)
    const reads: Block[] = back.map((p) => ({ local: [t.segment, bytes + p.dst], remote: [SEGMENT, p.src], length: p.length }))
    try {
      const result = await t.agent.read(t.peer!, reads, { timeoutMs })
      workRequests += result.workRequests
      readMBps = mbps(bytes, result.ms)
      const wrong = wrongPieces(view, bytes, pattern(bytes, seed), back)
      if (wrong.length) problems.push(`${wrong.length} of ${back.length} blocks read hold other bytes (first: ${wrong[0]})`)
      else bytesVerified += bytes
    } catch (error) {
      problems.push(`read rejected: ${(error as { code?: string }).code ?? ''} ${(error as Error).message}`)
    }
  }
  control.send({ type: 'transfer-done', problems: problems.filter((p) => !p.startsWith('host 0: ')) })
  return { blocks: pieces.length, workRequests, writeMBps, readMBps, bytesVerified, problems }
}

export interface TransferFlapResult {
  /** Host 1: the transfer the flap hit, settled one way or the other. */
  first?: { ok: boolean; code?: string; bytesLanded?: number; ms: number }
  /** Host 1: when the flap failed the write, agent.resume() of its error once the link is back: what it sent against what had not landed. */
  resumed?: { ok: boolean; code?: string; bytesSent?: number; bytesNeeded: number; ms: number }
  events?: Array<{ type: string; ms: number }>
  /** The round after the link came back (reconnecting if the link broke). */
  after: TransferRoundResult
  problems: string[]
}

/**
 * Host 1 takes its link down for `downMs` in the middle of a write of random
 * blocks with a notification: the write settles within its bound (resolved:
 * every block is checked on host 0; rejected: with a code and the bytes
 * landed), and the next round, after the link is back, moves verified data.
 * The engine closes a failed link while the port may still be down: the
 * round after proves that does not cost the host its rdma_cm.
 */
/** With `mustFail`, a write the flap did not fail is a problem: the round is there to prove the resume. */
export async function transferLinkFlap(t: TransferSession, control: Control, options: { downMs: number; round: TransferRound; mustFail?: boolean }): Promise<TransferFlapResult> {
  const { bytes, seed, timeoutMs } = options.round
  const pieces = scatter(bytes, seed + 1, 16)
  const problems: string[] = []
  if (role === '0') {
    const view = t.segment.bytes
    view.fill(0, bytes, 2 * bytes)
    control.send({ type: 'flap-ready' })
    const { ok } = await control.expect('flap-settled', timeoutMs + 120_000)
    if (ok) {
      const wrong = wrongPieces(view, bytes, pattern(bytes, seed + 1), pieces)
      if (wrong.length) problems.push(`the write resolved but ${wrong.length} of ${pieces.length} blocks hold other bytes`)
    }
    control.send({ type: 'flap-checked', problems })
    const after = await passive(t, control, { ...options.round, seed: seed + 10 })
    return { after, problems: [...problems, ...after.problems] }
  }
  const view = t.segment.bytes
  view.set(pattern(bytes, seed + 1), 0)
  await control.expect('flap-ready', timeoutMs)
  const writes: Block[] = pieces.map((p) => ({ local: [t.segment, p.src], remote: [SEGMENT, bytes + p.dst], length: p.length }))
  // A 20 ms delay on the wire keeps the write in flight when the link goes down
  // (on a clean wire 2 MiB can land in 0.2 s); under the 67 ms ACK timeout, so no retransmission.
  netem(['delay', '20ms'])
  let done = false
  let failure: unknown
  const start = performance.now()
  const settled: Promise<NonNullable<TransferFlapResult['first']>> = t.agent.write(t.peer!, writes, { notify: `flap ${seed}`, timeoutMs }).then(
    () => ({ ok: true, ms: performance.now() - start }),
    (error: { code?: string; bytesLanded?: number }) => {
      failure = error
      return { ok: false, code: error.code, bytesLanded: error.bytesLanded, ms: performance.now() - start }
    })
    .finally(() => { done = true })
  let events: Array<{ type: string; ms: number }>
  try {
    await new Promise((resolve) => setTimeout(resolve, 200))
    if (done) problems.push('the write settled before the link went down: the flap hit nothing')
    ;({ events } = await flapLink(t.agent.device!, options.downMs))
  } finally {
    clearNetem()
  }
  const first = await settled
  if (!first.ok && typeof first.code !== 'string') problems.push('the write rejected without a code')
  // A write the flap failed is resumed once the link is back: only what had not landed is sent
  // (at most 1.1x those bytes), and host 0 then checks every block of the original write.
  let resumed: TransferFlapResult['resumed']
  if (first.ok && options.mustFail) problems.push(`the write resolved after ${Math.round(first.ms)} ms: the flap did not cut it, so nothing was resumed`)
  if (!first.ok) {
    if (!(failure instanceof TransferError)) problems.push(`the write rejected with ${String(failure)}, not a TransferError (nothing to resume)`)
    else resumed = await resumeAfterFlap(t, failure, timeoutMs, problems)
  }
  control.send({ type: 'flap-settled', ok: first.ok || resumed?.ok === true })
  const checked = await control.expect('flap-checked', timeoutMs + 120_000)
  problems.push(...(checked.problems as string[]).map((p) => `host 0: ${p}`))
  const after = await active(t, control, { ...options.round, seed: seed + 10 })
  return { first, ...(resumed ? { resumed } : {}), events, after, problems: [...problems, ...after.problems] }
}

/** agent.resume() of the write a flap failed: it must complete and send no more than 1.1x the bytes that had not landed. */
async function resumeAfterFlap(t: TransferSession, failure: TransferError, timeoutMs: number, problems: string[]): Promise<NonNullable<TransferFlapResult['resumed']>> {
  const bytesNeeded = failure.bytes - failure.bytesLanded
  const start = performance.now()
  try {
    // The peer process did not restart: what landed in its memory is still there.
    const result = await t.agent.resume(failure, { timeoutMs })
    if (result.restarted) problems.push('the resume found another incarnation of the peer (it did not restart)')
    if (result.bytes > 1.1 * bytesNeeded) problems.push(`the resume sent ${result.bytes} bytes where ${bytesNeeded} had not landed (more than 1.1x)`)
    return { ok: true, bytesSent: result.bytes, bytesNeeded, ms: performance.now() - start }
  } catch (error) {
    problems.push(`the resume after the flap failed: ${(error as Error).message}`)
    return { ok: false, code: (error as { code?: string }).code, bytesNeeded, ms: performance.now() - start }
  }
}

/**
 * Host 1 drops every packet it sends while its agent writes random blocks to
 * host 0 with `timeoutMs`: the write must reject with a code, within its
 * bound (the engine's QPs retry without end on rxe: retryCount 7), and the
 * next round, with the wire clean, moves verified blocks (over the same link,
 * or a new one if the engine closed the failed one).
 */
export async function transferTotalLoss(t: TransferSession, control: Control, options: { timeoutMs: number; round: TransferRound }) {
  const { bytes, seed } = options.round
  const problems: string[] = []
  if (role === '0') {
    control.send({ type: 'loss-ready' })
    await control.expect('loss-settled', options.timeoutMs + 120_000)
    const after = await passive(t, control, { ...options.round, seed: seed + 10 })
    return { after, problems: after.problems }
  }
  const pieces = scatter(bytes, seed + 1, 16)
  t.segment.bytes.set(pattern(bytes, seed + 1), 0)
  await control.expect('loss-ready', 120_000)
  const start = performance.now()
  netem(['loss', '100%'])
  let first: { ok: boolean; code?: string; ms: number }
  try {
    first = await t.agent.write(t.peer!, pieces.map((p) => ({ local: [t.segment, p.src], remote: [SEGMENT, bytes + p.dst], length: p.length })), { timeoutMs: options.timeoutMs })
      .then(() => ({ ok: true, ms: performance.now() - start }), (error: { code?: string }) => ({ ok: false, code: error.code, ms: performance.now() - start }))
  } finally {
    clearNetem()
  }
  if (first.ok) problems.push('the write resolved with every packet dropped')
  else if (typeof first.code !== 'string') problems.push('the write rejected without a code')
  if (first.ms > options.timeoutMs + 5000) problems.push(`the write settled ${Math.round(first.ms)} ms after it began, past its timeoutMs (${options.timeoutMs}) + 5 s`)
  control.send({ type: 'loss-settled' })
  const after = await active(t, control, { ...options.round, seed: seed + 10 })
  return { first, timeoutMs: options.timeoutMs, after, problems: [...problems, ...after.problems] }
}
