// Renders the rows of the fault campaign (bench/results/faults-figures.json,
// written by scripts/faults.mjs) as the markdown table of docs/reliability.md.
//   node scripts/faults-table.mjs [FILE]
import { readFileSync } from 'node:fs'

const ms = (x) => `${Math.round(x)} ms`
const counts = (c) => (c ? `qp ${c.qp}, cq ${c.cq}, pd ${c.pd}, mr ${c.mr}, cm_id ${c.cm_id}, fds ${c.fds}` : '?')
const codes = (settled) => Object.entries(settled.reduce((acc, r) => (r.ok ? acc : { ...acc, [r.code]: (acc[r.code] ?? 0) + 1 }), {})).map(([k, v]) => `${v}× ${k}`).join(', ')

const CHECKS = {
  netem: 'RC WRITE + READ of the size shown, 64 SENDs of 4 KiB, 64 fetch-and-adds + 1 compare-and-swap; sha256 on both sides, atomics exactly once',
  retry: 'WRITE through a hand-made RC QP while host 1 drops 100% of its packets: rejects with RETRY_EXC_ERR, never hangs',
  retry7: 'same with retryCount 7: the request\'s timeoutMs bounds it',
  ud: '400 UD datagrams of 1 KiB: each one that arrives is intact (sha256 per sequence number), the others are counted as lost',
  flap: 'ip link set eth0 down, 3 s, up on host 1 during 16 WRITEs of 1 MiB: PORT_ERR then PORT_ACTIVE; every WRITE settles; resolved ones left the right bytes; a new connection moves verified data',
  kill: 'SIGKILL of the peer process during WRITEs/READs: every promise settles, `rdma resource show` counts and fds back to baseline; the kernel frees the dead process\'s objects; the restarted peer (same address and port) gets a fresh connection with verified data and nothing of the old one',
  cmDown: 'host 1 uses rdma_cm while its link is down (3 s): closes its connection, disconnects it, or rejects a request and re-listens on the same port; then reconnects: the first attempt works, verified data moves, the kernel\'s cm_id count returns to the baseline',
  neighFlush: 'host 1 empties its neighbour table before each of 30 connects (timeoutMs 5000): every connect succeeds (the kernel can miss the ARP answer; connect() resolves in attempts of 1 s)',
  engineKill: 'SIGKILL of the peer\'s transfer agent during host 0\'s writes of random blocks: every write settles, counts and fds back to baseline, the kernel frees the dead process\'s objects; a restarted agent gets the blocks written to it and nothing else',
  enginePoweroff: 'host 1\'s guest powers off (sysrq o) during host 0\'s writes of random blocks to a transfer agent there: every write settles, coded, within its timeoutMs (20 s) + 5 s; once host 0 closes the peer, counts and fds back to baseline',
  poweroff: 'host 1\'s guest powers off (sysrq o) during WRITEs/READs: every promise settles within its timeoutMs, counts and fds back to baseline',
}

const settledCodes = (r) => Object.entries(r.codes ?? {}).map(([k, v]) => `${v}× ${k}`).join(', ')

/** The transfer engine's round of a netem step (test/two-host/faults/transfer-round.ts): random blocks over 2 QPs, write with a notification, read back. */
function transferFigure(h0, h1) {
  const t1 = h1?.transfer
  const t0 = h0?.transfer
  if (!t1 && !t0) return 'not run under this fault'
  if (t1?.first && t1.timeoutMs) { // 100% loss (transferTotalLoss)
    const f = t1.first
    return `write under 100% loss: ${f.ok ? 'resolved (!)' : f.code} after ${ms(f.ms)} (timeoutMs ${t1.timeoutMs}); next write on a clean wire: ${t1.after?.blocks} blocks, ${t1.after?.bytesVerified} bytes verified by host 1, ${t0?.after?.bytesVerified} by host 0${t1.problems.length ? `; ${t1.problems.join('; ')}` : ''}`
  }
  if (t1?.first) { // a link flap (transferLinkFlap)
    const f = t1.first
    return `the write the flap hit: ${f.ok ? 'resolved' : f.code} after ${ms(f.ms)} (${f.bytesLanded} bytes known landed); ` +
      `next round reconnected: ${t1.after?.blocks} blocks, ${t1.after?.bytesVerified} bytes verified by host 1, ${t0?.after?.bytesVerified} by host 0${t1.problems.length ? `; ${t1.problems.join('; ')}` : ''}`
  }
  const problems = [...(t1?.problems ?? [])]
  return `${t1?.blocks ?? t0?.blocks} blocks, ${t1?.workRequests} WRs: write + notification ${t1?.writeMBps} MiB/s, read ${t1?.readMBps} MiB/s; ` +
    `${t1?.bytesVerified} bytes verified by host 1, ${t0?.bytesVerified} by host 0${problems.length ? `; ${problems.join('; ')}` : ''}`
}

export function table(rows) {
  const byFault = new Map()
  for (const row of rows) {
    const entry = byFault.get(row.fault) ?? {}
    entry[row.host] = row
    byFault.set(row.fault, entry)
  }
  const lines = ['| fault | what is checked | figure measured (verbs API) | transfer engine | result |', '|---|---|---|---|---|']
  for (const [fault, { 0: h0, 1: h1 }] of byFault) {
    const any = h0 ?? h1
    let check = ''
    let figure = ''
    if (any.error) figure = `error: ${(h0?.error ? `host 0: ${String(h0.error).split('\n')[0]}; ` : '') + (h1?.error ? `host 1: ${String(h1.error).split('\n')[0]}` : '')}`
    else if (fault.startsWith('100% loss') && fault.includes('retryCount 7')) {
      check = CHECKS.retry7
      figure = `${any.code} after ${ms(any.ms)} (timeoutMs 10000)`
    } else if (fault.startsWith('100% loss')) {
      check = CHECKS.retry
      figure = `${any.code} after ${ms(any.ms)}; implied bound (retryCount + 1) · 4.096 µs · 2^timeout = ${ms(any.impliedMs)}`
    } else if (fault.startsWith('UD')) {
      check = CHECKS.ud
      figure = `sent ${h1?.sent} (${h1?.sendsCompleted} send completions, all successful), received ${h0?.received} intact, lost ${h0?.lost}, damaged ${h0?.corrupt}`
    } else if (fault.startsWith('link flap')) {
      check = CHECKS.flap
      const ev = h1?.events ?? []
      figure = `events ${ev.map((e) => e.type).join(', ')}; ${h1?.completed} of ${h1?.settled?.length} WRITEs resolved (bytes verified by host 0, ${h0?.wrong?.length} wrong), ${h1?.completed === h1?.settled?.length ? "none rejected" : `the rest rejected (${codes(h1?.settled ?? [])})`}, last settled after ${ms(h1?.maxSettleMs)}; new connection: ${h1?.after?.bytesVerified} bytes verified`
    } else if (fault.startsWith('rdma_cm while the link is down') || fault.startsWith('a connection closed while')) {
      check = CHECKS.cmDown
      figure = `${h1?.how ?? 'close'} while down${h1?.downCallMs >= 0 ? ` (returned in ${ms(h1.downCallMs)})` : ''}; reconnect ${ms(h1?.reconnectMs)} after PORT_ACTIVE${h1?.stalls?.length ? `, first attempt timed out: ${h1.stalls.length}` : ', first attempt'}; cm_ids ${h1?.cmIds?.before} before, ${h1?.cmIds?.whileDown} while down, ${h1?.cmIds?.after} after; ${h1?.after?.bytesVerified} bytes verified on the new connection${h0?.rejectedWith ? `; host 0's rejected request: ${h0.rejectedWith}` : ''}`
    } else if (fault.startsWith('connect after a neighbour flush')) {
      check = CHECKS.neighFlush
      const slow = (h1?.outcomes ?? []).filter((o) => !o.startsWith('ok') || Number(o.split(' ')[1]) > 900)
      figure = `${h1?.connected} of ${h1?.rounds} connected; ${slow.length} needed a second attempt or failed${slow.length ? ` (${slow.join(', ')})` : ''}`
    } else if (fault.startsWith('peer guest powered off') && fault.includes('transfer engine')) {
      const r = h0 ?? {}
      lines.push(`| ${fault} | ${CHECKS.enginePoweroff} | (engine only) | ${r.writes} writes: ${r.completed} resolved, ${settledCodes(r)}, last settled after ${ms(r.maxSettleMs)}; counts before: ${counts(r.before)}; after closing the peer: ${counts(r.after)} | ${h0?.result === 'fail' ? `fail: ${(h0.failures ?? []).join('; ')}` : 'pass'} |`)
      continue
    } else if (fault.startsWith('kill -9 of the peer agent')) {
      check = CHECKS.engineKill
      const r = h0 ?? {}
      lines.push(`| ${fault} | ${check} | (engine only) | ${r.writes} writes: ${r.completed} resolved, ${settledCodes(r)}, last settled after ${ms(r.maxSettleMs)}; counts before: ${counts(r.before)}; after: ${counts(r.after)}; killed agent after SIGKILL: ${counts(h1?.peerAfterKill)}; restarted agent: blocks verified ${r.restart?.verified}, rest untouched ${r.restart?.untouched}, counts after closing it: ${counts(r.restart?.afterClose)} | ${(h0?.result === 'fail' || h1?.result === 'fail') ? `fail: ${[...(h0?.failures ?? []), ...(h1?.failures ?? [])].join('; ')}` : 'pass'} |`)
      continue
    } else if (fault.startsWith('kill -9')) {
      check = CHECKS.kill
      const r = h0 ?? {}
      figure = `${r.requests} requests: ${r.completed} resolved, ${settledCodes(r)}, last settled after ${ms(r.maxSettleMs)}, 'disconnected' ${r.disconnected ? 'emitted' : 'NOT emitted'}; counts before: ${counts(r.before)}; after: ${counts(r.after)}; killed process after SIGKILL: ${counts(h1?.peerAfterKill)}; restart: greeting of generation ${r.restart?.generation}, region otherwise untouched: ${r.restart?.untouched}, 1 MiB verified: ${r.restart?.verified}, counts after: ${counts(r.restart?.afterRestart)}`
    } else if (fault.startsWith('peer guest powered off')) {
      check = CHECKS.poweroff
      const r = h0 ?? {}
      figure = `${r.requests} requests: ${r.completed} resolved, ${settledCodes(r)}, last settled after ${ms(r.maxSettleMs)}, 'disconnected' ${r.disconnected ? 'emitted' : 'not emitted'}; counts before: ${counts(r.before)}; after: ${counts(r.after)}`
    } else {
      check = CHECKS.netem
      const p = h1?.perftest ?? h0?.perftest
      let perf = `ib_write_bw: ${p?.failed ? 'no result' : '?'}`
      if (p?.mbPerSec > 0) perf = `ib_write_bw (64 KiB) ${p.mbPerSec} MiB/s${p.wallMBps ? ` (wall clock of its whole run, set-up included: ${p.wallMBps})` : ''}; WRITE/ib_write_bw = ${(h1.writeMBps / p.mbPerSec).toFixed(2)}`
      else if (p?.wallMBps > 0) perf = `ib_write_bw (64 KiB) ${p.wallMBps} MiB/s by the wall clock (its own figure: ${p.mbPerSec ?? 'none'}); WRITE/ib_write_bw = ${(h1.writeMBps / p.wallMBps).toFixed(2)}`
      else if (p?.mbPerSec === 0) perf = 'ib_write_bw printed 0.00 MB/sec (it computes its figure from the CPU cycle counter; unusable in this run): no comparison'
      figure = `netem \`${any.netem}\`; ${h1 ? `${(h1.bytesVerified - 64 * 4096) / 2 / 1048576} MiB` : ''} WRITE ${h1?.writeMBps} MiB/s, READ ${h1?.readMBps} MiB/s; ${h1?.bytesVerified} bytes verified by host 1, ${h0?.bytesVerified} by host 0; ${perf}`
    }
    const failures = [...(h0?.failures ?? []), ...(h1?.failures ?? [])]
    const result = (h0?.result === 'fail' || h1?.result === 'fail') ? `fail${failures.length ? `: ${failures.join('; ')}` : ''}` : 'pass'
    lines.push(`| ${fault} | ${check} | ${figure.replaceAll('|', '\\|')} | ${transferFigure(h0, h1).replaceAll('|', '\\|')} | ${result} |`)
  }
  return lines.join('\n')
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const file = process.argv[2] ?? new URL('../bench/results/faults-figures.json', import.meta.url).pathname
  console.log(table(JSON.parse(readFileSync(file, 'utf8'))))
}
