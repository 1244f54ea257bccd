// Starts a checked plan on a link, with its notification: on an RDMA link
// it is numbered now (call order) and rides with the data (a write's last
// batches) or follows it (a read's); on a TCP link it takes its turn on the
// control channel at once. The peer's counters follow the run.
import type { WaitOptions } from '../core/validate.js'
import type { ProgressOptions } from './agent-settings.js'
import type { Link } from './link.js'
import { encodeNotification, type NoticePayload } from './notifications.js'
import type { OutgoingNotice } from './notice-sender.js'
import type { Peer } from './peer.js'
import type { Blocks, CheckedPlan, TransferOp } from './plan.js'
import { TransferRun, type RunHooks, type TransferResult } from './run.js'
import { TransferError } from './transfer-error.js'

/** What a launch needs of its agent (made once per agent, not per transfer). */
export interface Launcher {
  /** A batch failed and its QP is in the error state: the link to `peer` is broken. */
  linkFailed(peer: Peer, link: Link, error: Error): void
  /** A batch of `bytes` completed on rail `rail` (stats()'s per-rail bytes). */
  railBytes(rail: number, bytes: number): void
  /** A run of the caller's `blocks` failed with `error`: agent.resume() takes it from now on. */
  failed(error: TransferError, peer: Peer, op: TransferOp, blocks: Blocks): void
}

/** How a run's notification goes: the run hooks it needs, and what to do when the run settles. */
function notificationOf(link: Link, plan: CheckedPlan, payload: NoticePayload): { hooks: Pick<RunHooks, 'notify' | 'notice'>; settled: (failed: boolean) => void } {
  const notices = link.notices
  if (notices) {
    const seq = notices.take()
    let notice: OutgoingNotice | undefined
    const hooks = plan.op === 'write' ? { notice: notice = notices.forWrite(seq, plan, payload) } : { notify: () => notices.send(seq, payload) }
    return {
      hooks,
      settled: (failed) => {
        notice?.settled()
        // The peer holds later notifications until this number is done: tell it this one will not come.
        if (failed && link.healthy) notices.skip(seq)
      },
    }
  }
  let dataPlaced!: (ok: boolean) => void
  const sent = link.queueMessage(new Promise<boolean>((r) => { dataPlaced = r }), encodeNotification(payload))
  sent.catch(() => undefined)
  return { hooks: { notify: () => { dataPlaced(true); return sent } }, settled: () => dataPlaced(false) } // no-op once resolved with true
}

/**
 * `blocks`: the caller's, for a failure to be resumable (write(), read(),
 * plan.run()); undefined for a resume's own attempt (resume.ts reports that).
 * Marked as the promise rejects: no handler per transfer for it.
 */
export function launch(launcher: Launcher, peer: Peer, link: Link, plan: CheckedPlan, blocks: Blocks | undefined, notify: NoticePayload | undefined,
  wait: WaitOptions, progress: ProgressOptions): Promise<TransferResult> {
  return new Promise<TransferResult>((resolve, reject) => {
    const counters = peer.counters
    const notification = notify ? notificationOf(link, plan, notify) : undefined
    counters.inFlight++
    // Every field present, so that hooks have one shape whatever the notification.
    const run = new TransferRun(plan, {
      peer: peer.id,
      notify: notification?.hooks.notify,
      notice: notification?.hooks.notice,
      onBatchError: (error) => launcher.linkFailed(peer, link, error),
      railDone: launcher.railBytes,
      railFailed: link.meter ? (rail, error) => link.railFailed(rail, error) : undefined,
      resubmit: link.meter ? (r) => link.wakeUp(r) : undefined,
      markers: notification?.hooks.notice && link.notices ? (count) => {
        const seq = notification.hooks.notice!.seq
        return Promise.all(Array.from({ length: count }, () => link.notices!.marker(seq))).then(() => undefined)
      } : undefined,
      measured: link.meter ? (bytes, ms) => { for (let r = 0; r < bytes.length; r++) link.meter!.record(r, bytes[r]!, ms[r]!) } : undefined,
      settled: (r, error, result) => {
        link.runs.delete(r)
        link.stalls.settled()
        counters.inFlight--
        notification?.settled(error !== undefined)
        if (error) {
          counters.errors++
          if (blocks !== undefined && error instanceof TransferError) launcher.failed(error, peer, plan.op, blocks)
          reject(error)
        } else {
          counters.transfers++
          counters.bytes += result!.bytes
          counters.workRequests += result!.workRequests
          if (notify) counters.notificationsSent++
          counters.recordLatency(result!.ms)
          resolve(result!)
        }
      },
    })
    if (!link.healthy) {
      run.fail(run.failure(link.error, 'the link to the peer failed'))
      return
    }
    link.runs.add(run)
    // Rails already down on this link (failed, or unreachable since the handshake): their lanes post nothing, not even put-back slices.
    if (link.meter?.anyDown) for (let r = 0; r < link.meter.rails; r++) if (link.meter.isDown(r)) run.railDown(r * link.perRail, (r + 1) * link.perRail)
    run.start(link.posters, { timeoutMs: wait.timeoutMs, stallTimeoutMs: progress.stallTimeoutMs, signal: wait.signal, onProgress: progress.onProgress }, link.stalls)
  })
}
