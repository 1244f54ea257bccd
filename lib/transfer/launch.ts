// Starts a checked plan on a link: the notification takes its turn at once
// (notifications go out in call order), the peer's counters follow the run.
import type { WaitOptions } from '../core/validate.js'
import type { ProgressOptions } from './agent-settings.js'
import type { NotifyMessage } from './control.js'
import type { Link } from './link.js'
import type { Peer } from './peer.js'
import type { CheckedPlan } from './plan.js'
import { TransferRun, type TransferResult } from './run.js'

export function launch(peer: Peer, link: Link, plan: CheckedPlan, notify: NotifyMessage | undefined, wait: WaitOptions,
  progress: ProgressOptions, onBatchError: (error: Error) => void): Promise<TransferResult> {
  return new Promise<TransferResult>((resolve, reject) => {
    const counters = peer.counters
    let dataPlaced: ((ok: boolean) => void) | undefined
    let sent: Promise<void> | undefined
    if (notify) {
      const ready = new Promise<boolean>((r) => { dataPlaced = r })
      sent = link.queueMessage(ready, notify)
      sent.catch(() => undefined)
    }
    counters.inFlight++
    const run = new TransferRun(plan, {
      peer: peer.id,
      ...(sent ? { notify: () => { dataPlaced!(true); return sent! } } : {}),
      onBatchError,
      settled: (r, error, result) => {
        link.runs.delete(r)
        counters.inFlight--
        dataPlaced?.(false) // no-op once resolved with true
        if (error) {
          counters.errors++
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
    run.start(link.posters, { timeoutMs: wait.timeoutMs, stallTimeoutMs: progress.stallTimeoutMs, signal: wait.signal, onProgress: progress.onProgress })
  })
}
