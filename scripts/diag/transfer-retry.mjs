// Diagnosis of two-host test 20's REM_INV_REQ_ERR (a tool, not a test; see
// docs/softroce.md, "Retransmission on Soft-RoCE"). Runs on both guests: for
// each variant, host 1 writes the test's 256 MiB layout into host 0's
// segment; host 0 waits for the notification or for the writer to go away
// (bounded), and both print rxe's counter deltas.
//   bash scripts/softroce.sh run --topology two-host -- node scripts/diag/transfer-retry.mjs 'branch:4:128:65536:14!' branch:4:128:65536:18
// VARIANT is tree:qps:depth[:slice[:ackTimeout]]; tree 'branch' is this
// checkout's dist, 'base' the dist in $BASE_DIST (another checkout's
// dist/index.js). A trailing '!' traces the variant with kprobes (root, 6.1
// struct offsets): every request packet the responder gets, every packet the
// requester sends, every ACK/NAK; around the first NAK the trace is printed.
// DDEBUG=1 adds rxe's dynamic debug; SNIFF=1 a Python AF_PACKET capture
// (roce-sniff.py; it starts in ~45 s in an emulated guest and misses packets).
import { readdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs'
import { execSync, spawn } from 'node:child_process'

const role = process.env.SOFTROCE_HOST_INDEX
const local = process.env.SOFTROCE_ADDR
const peerAddr = process.env.SOFTROCE_PEER_ADDR
const SIZE = 256 << 20
const SEED = 20
const TREES = { branch: new URL('../../dist/index.js', import.meta.url).href, base: process.env.BASE_DIST }

function layout(seed) {
  let x = seed >>> 0
  const next = () => { x = (x * 1103515245 + 12345) >>> 0; return x }
  const lengths = []
  for (let total = 0; total < SIZE;) { const length = Math.min(SIZE - total, (1 + (next() % 256)) * 4096); lengths.push(length); total += length }
  const order = lengths.map((_, i) => i)
  for (let i = order.length - 1; i > 0; i--) { const j = next() % (i + 1); [order[i], order[j]] = [order[j], order[i]] }
  const dstOf = new Array(lengths.length)
  let at = 0
  for (const i of order) { dstOf[i] = at; at += lengths[i] }
  let src = 0
  return lengths.map((length, i) => { const block = { src, dst: dstOf[i], length }; src += length; return block })
}

function counters() {
  const out = {}
  for (const dev of readdirSync('/sys/class/infiniband')) {
    const dir = `/sys/class/infiniband/${dev}/ports/1/hw_counters`
    if (!existsSync(dir)) continue
    for (const f of readdirSync(dir)) out[f] = Number(readFileSync(`${dir}/${f}`, 'utf8'))
  }
  return out
}
function delta(a, b) { const d = {}; for (const k of Object.keys(b)) if (b[k] !== a[k]) d[k] = b[k] - (a[k] ?? 0); return d }
function sh(cmd) { try { return execSync(cmd, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }) } catch (e) { return `(${cmd}: ${e.message.split('\n')[0]})` } }
const log = (...a) => console.log(`[h${role} ${new Date().toISOString().slice(11, 23)}]`, ...a)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function within(promise, ms, what) {
  let timer
  return Promise.race([promise, new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms) })]).finally(() => clearTimeout(timer))
}

const DDC = '/sys/kernel/debug/dynamic_debug/control'
function debugOn(on) {
  if (!process.env.DDEBUG) return
  if (!existsSync(DDC)) sh('mount -t debugfs none /sys/kernel/debug')
  const files = role === '0' ? ['rxe_resp.c'] : ['rxe_comp.c', 'rxe_req.c']
  for (const f of files) sh(`echo 'file ${f} ${on ? '+p' : '-p'}' > ${DDC}`)
}

const TR = '/sys/kernel/tracing'
function kprobe(on) {
  if (!existsSync(`${TR}/kprobe_events`)) sh(`mount -t tracefs nodev ${TR}`)
  // Offsets (6.1, x86_64): sk_buff.cb at 0x28; rxe_pkt_info {rxe, qp, wqe, hdr@24, mask@32, psn@36, pkey_index@40, paylen@42, port_num@44, opcode@45}.
  const defs = role === '0'
    ? [
        // prepare_ack_packet(qp, ack, opcode, payload, psn, syndrome): every ACK/NAK the responder builds.
        "p:rxe_ack rdma_rxe:prepare_ack_packet opcode=%dx:s32 payload=%cx:s32 psn=%r8:u32 syn=%r9:u8",
        // rxe_resp_queue_pkt(qp, skb): every request packet handed to the responder.
        "p:rxe_rq rdma_rxe:rxe_resp_queue_pkt psn=+0x4c(%si):u32 op=+0x55(%si):u8 paylen=+0x52(%si):u16 rlen=+24(+0x40(%si)):u32",
      ]
    : [
        // rxe_xmit_packet(qp, pkt, skb): every packet the requester sends (retransmissions too).
        "p:rxe_tx rdma_rxe:rxe_xmit_packet psn=+36(%si):u32 op=+45(%si):u8 paylen=+42(%si):u16 rlen=+24(+24(%si)):u32",
        // rxe_comp_queue_pkt(qp, skb): every ACK/NAK the completer gets.
        "p:rxe_cq rdma_rxe:rxe_comp_queue_pkt psn=+0x4c(%si):u32 op=+0x55(%si):u8 syn=+12(+0x40(%si)):u8",
      ]
  if (on) {
    sh(`echo 65536 > ${TR}/buffer_size_kb; echo > ${TR}/trace`)
    for (const d of defs) log('kprobe', d.split(' ')[0], sh(`echo '${d}' >> ${TR}/kprobe_events && echo 1 > ${TR}/events/kprobes/${d.split(' ')[0].slice(2)}/enable && echo ok`).trim())
    if (role === '0') sh(`echo 'syn!=0x1f' > ${TR}/events/kprobes/rxe_ack/filter`)
  } else {
    for (const d of defs) sh(`echo 0 > ${TR}/events/kprobes/${d.split(' ')[0].slice(2)}/enable`)
    sh(`cat ${TR}/trace > /tmp/trace.txt`)
    const ev = []
    for (const line of readFileSync('/tmp/trace.txt', 'utf8').split('\n')) {
      const m = /\s([\d.]+): (rxe_\w+): \([^)]*\)(.*)$/.exec(line)
      if (!m) continue
      const f = { t: Number(m[1]), name: m[2] }
      for (const kv of m[3].trim().split(/\s+/)) { const [k, v] = kv.split('='); f[k] = Number(v) }
      ev.push(f)
    }
    const by = {}
    for (const e of ev) by[e.name] = (by[e.name] ?? 0) + 1
    log('trace events', JSON.stringify(by))
    const nak = ev.find((e) => (e.name === 'rxe_ack' || e.name === 'rxe_cq') && e.syn >= 0x60)
    if (!nak) { log('no NAK in the trace'); return }
    log('first NAK', JSON.stringify(nak))
    const P = nak.psn
    const near = ev.filter((e) => e.psn !== undefined && (((P - e.psn) & 0xffffff) <= 140 || ((e.psn - P) & 0xffffff) <= 4))
    const tx = {}
    for (const e of near) {
      const be = (x) => x === undefined ? '' : ` rlen=${((x & 0xff) << 24 | (x >> 8 & 0xff) << 16 | (x >> 16 & 0xff) << 8 | (x >>> 24)) >>> 0}`
      const key = `${e.name}:${e.psn}`
      tx[key] = (tx[key] ?? 0) + 1
      console.log(`  E${role} ${e.t.toFixed(6)} ${e.name} psn=${e.psn} d=${((e.psn - P) << 8) >> 8} op=${e.op ?? e.opcode}${e.paylen !== undefined ? ` paylen=${e.paylen}` : ''}${e.syn !== undefined ? ` syn=${e.syn.toString(16)}` : ''}${[6, 10, 11].includes(e.op) ? be(e.rlen) : ''} #${tx[key]}`)
    }
  }
}

const blocks = layout(SEED)
sh('dmesg -n 1') // debug lines into the ring buffer only, not the console
const kmsg = execSync('sh -c "cat /dev/kmsg > /tmp/kmsg.log 2>&1 & echo $!"', { encoding: 'utf8' }).trim()
log('kmsg reader pid', kmsg, 'mtu', sh('ip link show eth0 | head -1').trim())

let k = 0
for (const spec of process.argv.slice(2)) {
  k++
  const debug = spec.endsWith('!')
  const [tree, qs, ds, ss, at] = spec.replace('!', '').split(':')
  const qps = Number(qs); const depth = Number(ds); const sliceBytes = Number(ss ?? 65536)
  const { TransferAgent } = await import(TREES[tree])
  const port = 7600 + k
  const before = counters()
  const kmsgStart = Number(sh('wc -l < /tmp/kmsg.log').trim()) || 0
  if (debug) debugOn(true)
  let sniffer
  if (debug) {
    sh('rm -f /tmp/sniff.ready /tmp/sniff.out')
    if (process.env.SNIFF) sniffer = spawn('sh', ['-c', `exec python3 ${new URL('roce-sniff.py', import.meta.url).pathname} eth0 > /tmp/sniff.out 2>&1`], { stdio: 'ignore' })
    if (sniffer) {
      sniffer.on('error', (e) => log('sniffer', e.message))
      for (let i = 0; i < 600 && !existsSync('/tmp/sniff.ready'); i++) await sleep(100)
      log('sniffer ready', existsSync('/tmp/sniff.ready'), sh('cat /tmp/sniff.out'))
    }
    kprobe(true)
  }
  log(`== variant ${k} ${spec}: tree ${tree} qps ${qps} depth ${depth} slice ${sliceBytes} ackTimeout ${at ?? 'default'}`)
  const t0 = Date.now()
  if (role === '0') {
    const agent = await TransferAgent.create({ host: local, port, name: 'decode' })
    try {
      const kv = agent.register('kv', { size: SIZE, remote: 'read-write' })
      const got = await within(new Promise((resolve) => {
        agent.once('notification', (n) => resolve(`notification ${n.message}`))
        agent.on('peerLost', (p) => resolve(`peerLost ${p?.name ?? ''}`))
      }), 200_000, 'the writer').catch((e) => e.message)
      log(`variant ${k}: ${got} after ${Date.now() - t0} ms`)
      if (got.startsWith('notification')) {
        void kv
        await sleep(3000)
      }
    } finally { agent.close() }
  } else {
    const agent = await TransferAgent.create({ host: local, port: 0, name: 'prefill', qpsPerPeer: qps, queueDepth: depth, sliceBytes, ...(at ? { ackTimeout: Number(at) } : {}) })
    try {
      const src = agent.register('src', { size: SIZE })
      blocks.forEach((b, i) => src.bytes.fill(i & 0xff, b.src, b.src + b.length))
      let peer
      for (let attempt = 0; !peer; attempt++) {
        try { peer = await agent.connect({ host: peerAddr, port, timeoutMs: 10_000 }) } catch (error) { if (attempt > 120) throw error; await sleep(500) }
      }
      while (!peer.segments.has('kv')) await sleep(20)
      log('data qpns', (peer.link?.posters ?? []).map((p) => p.qp.qpn))
      const list = blocks.map((b) => ({ local: [src, b.src], remote: ['kv', b.dst], length: b.length }))
      const t1 = Date.now()
      try {
        const r = await agent.write(peer, list, { notify: `written ${SEED}`, timeoutMs: 150_000 })
        log(`variant ${k}: OK ${r.bytes} bytes, ${r.workRequests} WRs, ${r.ms.toFixed(0)} ms`)
      } catch (e) {
        log(`variant ${k}: FAILED after ${Date.now() - t1} ms: ${e.message} code ${e.code} status ${e.status}`)
      }
      await sleep(2000)
    } finally { agent.close() }
  }
  if (debug) debugOn(false)
  if (debug) kprobe(false)
  if (sniffer) {
    const exited = new Promise((r) => sniffer.once('exit', r)); sniffer.kill('SIGTERM'); await within(exited, 180_000, 'the sniffer').catch((e) => log(e.message))
    console.log(sh('cat /tmp/sniff.out').split('\n').map((l) => `  S${role} ${l}`).join('\n'))
  }
  await sleep(3000)
  log(`variant ${k} counters delta`, JSON.stringify(delta(before, counters())))
  if (debug) {
    const lines = readFileSync('/tmp/kmsg.log', 'utf8').split('\n').slice(kmsgStart)
    log(`variant ${k}: ${lines.length} kmsg lines`)
    const errs = []
    lines.forEach((l, i) => { if (/ERR|WARN|Failed|error/i.test(l) && !/state = (GET_REQ|CHK_|EXECUTE|COMPLETE|ACKNOWLEDGE|CLEANUP|DONE|EXIT)\b/.test(l)) errs.push(i) })
    log(`variant ${k}: ${errs.length} error-ish lines; first ones with context:`)
    const shown = new Set()
    for (const i of errs.slice(0, 6)) {
      for (let j = Math.max(0, i - 40); j <= Math.min(lines.length - 1, i + 5); j++) if (!shown.has(j)) { shown.add(j); console.log(`  K${role}:${j} ${lines[j].replace(/^[^;]*;/, '')}`) }
      console.log('  ----')
    }
    const hist = {}
    for (const l of lines) { const m = / state = (\S+)/.exec(l); if (m) hist[m[1]] = (hist[m[1]] ?? 0) + 1 }
    log(`variant ${k}: state histogram`, JSON.stringify(hist))
  }
  console.log(sh('dmesg | grep -v "state = " | tail -8'))
}
sh(`kill ${kmsg}`)
log('done')
