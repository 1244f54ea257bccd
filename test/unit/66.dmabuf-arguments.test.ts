// pd.registerDmabuf's argument checks (lib/verbs/dmabuf.ts), which run before
// anything reaches the device, so they are checked here without one. The
// refusal by a device (Soft-RoCE: EOPNOTSUPP) is test/rdma/24's.
import { describe, expect, it } from 'vitest'
import { Access } from '../../lib/core/constants.js'
import { native } from '../../lib/native/addon.js'
import { dmabufRange } from '../../lib/verbs/dmabuf.js'
import { thrown } from './thrown.js'

const RW = Access.LocalWrite | Access.RemoteWrite | Access.RemoteRead

describe('registerDmabuf arguments', () => {
  it('accepts an fd, a range and the flags ibv_reg_dmabuf_mr supports; iova defaults to offset', () => {
    expect(dmabufRange(3, 8192, 4096, RW | Access.RemoteAtomic | Access.Relaxed, undefined)).toEqual({ fd: 3, offset: 8192, length: 4096, iova: 8192 })
    expect(dmabufRange(0, 4096 + 12, 100, 0, 2 ** 40 + 12)).toEqual({ fd: 0, offset: 4108, length: 100, iova: 2 ** 40 + 12 })
  })

  it('refuses an fd that is not an integer from 0 to 2^31-1', () => {
    for (const fd of [-1, 1.5, 2 ** 31, NaN]) expect(thrown(() => dmabufRange(fd, 0, 4096, RW, undefined)).code, String(fd)).toBe('ERR_OUT_OF_RANGE')
    for (const fd of ['3', 3n, null, undefined]) expect(thrown(() => dmabufRange(fd, 0, 4096, RW, undefined)).code, String(fd)).toBe('ERR_INVALID_ARG_TYPE')
  })

  it('refuses offsets, lengths and iovas outside the safe integers, and an empty range', () => {
    const cases: Array<[unknown, unknown, unknown]> = [
      [-4096, 4096, undefined], [0.5, 4096, undefined], [0, 0, undefined], [0, -1, undefined],
      [4096, Number.MAX_SAFE_INTEGER - 4095, undefined], // offset + length over 2^53-1
      [0, 4096, -4096], [0, 4096, Number.MAX_SAFE_INTEGER - 4095], // iova + length over 2^53-1
    ]
    for (const [offset, length, iova] of cases) {
      expect(thrown(() => dmabufRange(3, offset, length, RW, iova)).code, JSON.stringify([offset, length, iova])).toBe('ERR_OUT_OF_RANGE')
    }
    expect(thrown(() => dmabufRange(3, 0, '4096', RW, undefined)).code).toBe('ERR_INVALID_ARG_TYPE')
    expect(thrown(() => dmabufRange(3, 0, 4096, RW, 4096n)).code).toBe('ERR_INVALID_ARG_TYPE')
  })

  it('refuses an iova whose page offset differs from the offset\'s (the verb\'s rule)', () => {
    const page = native.pageSize
    expect(page).toBeGreaterThanOrEqual(4096)
    const error = thrown(() => dmabufRange(3, 0, 4096, RW, 100))
    expect(error.code).toBe('ERR_OUT_OF_RANGE')
    expect(error.message).toContain('page offset')
    expect(thrown(() => dmabufRange(3, 100, 4096, RW, page)).code).toBe('ERR_OUT_OF_RANGE')
    expect(dmabufRange(3, 100, 4096, RW, page + 100).iova).toBe(page + 100)
  })

  it('refuses access flags the verb does not support, and remote writes without LocalWrite', () => {
    for (const access of [Access.MwBind, Access.ZeroBased, Access.OnDemand, RW | Access.MwBind]) {
      expect(thrown(() => dmabufRange(3, 0, 4096, access, undefined)).code, String(access)).toBe('ERR_OUT_OF_RANGE')
    }
    expect(thrown(() => dmabufRange(3, 0, 4096, -1, undefined)).code).toBe('ERR_OUT_OF_RANGE')
    expect(thrown(() => dmabufRange(3, 0, 4096, undefined, undefined)).code).toBe('ERR_INVALID_ARG_TYPE')
    for (const access of [Access.RemoteWrite, Access.RemoteAtomic | Access.RemoteRead]) {
      expect(thrown(() => dmabufRange(3, 0, 4096, access, undefined))).toMatchObject({ code: 'EINVAL', syscall: 'ibv_reg_dmabuf_mr' })
    }
  })
})
