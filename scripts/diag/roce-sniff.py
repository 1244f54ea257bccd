# RoCE v2 header sniffer for the diagnosis (scratch): AF_PACKET on eth0,
# logs each UDP/4791 packet's BTH (+RETH/AETH) until SIGTERM, then prints
# the packets around every NAK and a per-QP summary.
import socket, struct, signal, sys, time

IFACE = sys.argv[1] if len(sys.argv) > 1 else 'eth0'
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
s.bind((IFACE, 0))
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
s.settimeout(0.5)
open('/tmp/sniff.ready','w').write('1')
rows = []
OPS = {0x06: 'WF', 0x07: 'WM', 0x08: 'WL', 0x09: 'WLi', 0x0a: 'WO', 0x0b: 'WOi', 0x0c: 'RREQ', 0x11: 'ACK',
       0x00: 'SF', 0x01: 'SM', 0x02: 'SL', 0x03: 'SLi', 0x04: 'SO', 0x05: 'SOi', 0x0d: 'RRF', 0x0e: 'RRM', 0x0f: 'RRL', 0x10: 'RRO'}
t0 = time.time()
while not stop:
    try:
        data, addr = s.recvfrom(160)
    except socket.timeout:
        continue
    except InterruptedError:
        continue
    if len(data) < 14 + 20 + 8 + 12 or data[12:14] != b'\x08\x00':
        continue
    ihl = (data[14] & 0x0f) * 4
    if data[23] != 17:
        continue
    u = 14 + ihl
    dport, ulen = struct.unpack('!H2xH', data[u + 2:u + 8])[0], struct.unpack('!H', data[u + 4:u + 6])[0]
    if dport != 4791:
        continue
    b = u + 8
    op = data[b]
    pad = (data[b + 1] >> 4) & 3
    dqp = int.from_bytes(data[b + 5:b + 8], 'big')
    ack = data[b + 8] >> 7
    psn = int.from_bytes(data[b + 9:b + 12], 'big')
    hdr = 12
    extra = ''
    if op in (0x06, 0x0a, 0x0b, 0x0c):
        va, rkey, dlen = struct.unpack('!QII', data[b + 12:b + 28])
        extra = f' va={va:#x} rkey={rkey:#x} len={dlen}'
        hdr += 16
    if op in (0x09, 0x0b):
        hdr += 4
    if op in (0x11, 0x0d, 0x0f, 0x10):
        syn = data[b + hdr]
        msn = int.from_bytes(data[b + hdr + 1:b + hdr + 4], 'big')
        extra = f' syn={syn:#04x} msn={msn}'
        hdr += 4
    payload = ulen - 8 - hdr - 4 - pad
    direction = 'out' if addr[2] == socket.PACKET_OUTGOING else 'in'
    rows.append((time.time() - t0, direction, dqp, OPS.get(op, hex(op)), psn, payload, ack, extra))

def fmt(r):
    return f'{r[0]:8.3f} {r[1]:3} qp={r[2]} {r[3]:4} psn={r[4]} pay={r[5]} A={r[6]}{r[7]}'

print(f'SNIFF {len(rows)} packets', flush=True)
naks = [i for i, r in enumerate(rows) if r[3] == 'ACK' and 'syn=0x6' in r[7]]
seqnaks = [i for i, r in enumerate(rows) if r[3] == 'ACK' and 'syn=0x60' in r[7]]
print(f'SNIFF NAKs (syndrome 0x6x): {len(naks)}; of them PSN-sequence NAKs (0x60): {len(seqnaks)}', flush=True)
for i in [n for n in naks if rows[n][7].find('syn=0x60') < 0][:3]:
    qp_out = rows[i][2]
    print(f'SNIFF --- non-sequence NAK at row {i}: {fmt(rows[i])}')
    # The requests of that connection: the NAK's PSN names the bad request.
    psn = rows[i][4]
    near = [j for j in range(max(0, i - 4000), i + 1) if rows[j][1] == 'in' and abs(rows[j][4] - psn) <= 3]
    for j in near[-40:]:
        print('SNIFF   ', j, fmt(rows[j]))
    for j in range(max(0, i - 25), i + 1):
        print('SNIFF  .', j, fmt(rows[j]))
# Per-QP: requests in, duplicates (same psn seen twice), ACK/NAK out.
per = {}
seen = set()
for r in rows:
    key = r[2]
    d = per.setdefault(key, {'in': 0, 'dup': 0, 'out': 0, 'nak': 0})
    if r[1] == 'in':
        d['in'] += 1
        if (r[2], r[4], r[3]) in seen:
            d['dup'] += 1
        seen.add((r[2], r[4], r[3]))
    else:
        d['out'] += 1
        if 'syn=0x6' in r[7]:
            d['nak'] += 1
print('SNIFF per QP', per, flush=True)
# Timeline of the first NAK'd QP: gaps over 50 ms between packets.
if naks:
    i = naks[0]
    print('SNIFF first NAK', fmt(rows[i]))
with open('/tmp/sniff.log', 'w') as f:
    for r in rows:
        f.write(fmt(r) + '\n')
