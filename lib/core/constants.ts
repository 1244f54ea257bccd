// Values of rdma-core's enums (infiniband/verbs.h) that cross the native boundary.

/** Memory access flags (ibv_access_flags); combine with `|`. */
export const Access = {
  LocalWrite: 1,
  RemoteWrite: 1 << 1,
  RemoteRead: 1 << 2,
  RemoteAtomic: 1 << 3,
  MwBind: 1 << 4,
  ZeroBased: 1 << 5,
  OnDemand: 1 << 6,
  Relaxed: 1 << 20,
} as const

/** Queue pair transport types. Spelled out (not keyof typeof QpType) so the public .d.ts names no internal value. */
export type QpTypeName = 'RC' | 'UC' | 'UD'
export const QpType = { RC: 2, UC: 3, UD: 4 } as const satisfies Record<QpTypeName, number>

export const QpState = { RESET: 0, INIT: 1, RTR: 2, RTS: 3, SQD: 4, SQE: 5, ERR: 6 } as const
export type QpStateName = keyof typeof QpState
export const qpStateNames = Object.keys(QpState) as QpStateName[]

/** ibv_wr_opcode */
export const WrOpcode = {
  RdmaWrite: 0,
  RdmaWriteWithImm: 1,
  Send: 2,
  SendWithImm: 3,
  RdmaRead: 4,
  AtomicCmpAndSwp: 5,
  AtomicFetchAndAdd: 6,
  LocalInv: 7,
  BindMw: 8,
  SendWithInv: 9,
} as const

/** ibv_send_flags */
export const SendFlags = { Fence: 1, Signaled: 2, Solicited: 4, Inline: 8 } as const

/** ibv_wc_opcode, by value */
export const wcOpcodeNames: Record<number, string> = {
  0: 'SEND', 1: 'RDMA_WRITE', 2: 'RDMA_READ', 3: 'COMP_SWAP', 4: 'FETCH_ADD', 5: 'BIND_MW', 6: 'LOCAL_INV',
  128: 'RECV', 129: 'RECV_RDMA_WITH_IMM',
}

export const WcFlags = { Grh: 1, WithImm: 2, IpCsumOk: 4, WithInv: 8 } as const

/** ibv_wc_status, by value: the names carried by RdmaError.status. */
export const wcStatusNames = [
  'SUCCESS', 'LOC_LEN_ERR', 'LOC_QP_OP_ERR', 'LOC_EEC_OP_ERR', 'LOC_PROT_ERR', 'WR_FLUSH_ERR', 'MW_BIND_ERR',
  'BAD_RESP_ERR', 'LOC_ACCESS_ERR', 'REM_INV_REQ_ERR', 'REM_ACCESS_ERR', 'REM_OP_ERR', 'RETRY_EXC_ERR',
  'RNR_RETRY_EXC_ERR', 'LOC_RDD_VIOL_ERR', 'REM_INV_RD_REQ_ERR', 'REM_ABORT_ERR', 'INV_EECN_ERR',
  'INV_EEC_STATE_ERR', 'FATAL_ERR', 'RESP_TIMEOUT_ERR', 'GENERAL_ERR', 'TM_ERR', 'TM_RNDV_INCOMPLETE',
] as const

/** Path MTU in bytes <-> ibv_mtu enum. */
export const mtuBytes = [256, 512, 1024, 2048, 4096] as const
export function mtuEnum(bytes: number): number {
  const index = mtuBytes.indexOf(bytes as (typeof mtuBytes)[number])
  if (index < 0) throw Object.assign(new RangeError(`Expected one of ${mtuBytes.join(', ')} for mtu but received ${bytes}`), { code: 'ERR_OUT_OF_RANGE' })
  return index + 1
}
