// Layer 3: argument checks, error conversion, constants, and the JS-side
// lifetime/bookkeeping machinery (Resource, Pending, WorkQueueSlots). These
// are internals, imported from lib/ (one module graph per file: don't mix
// with dist/ here, or instanceof checks would compare different classes).
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest'
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { thrown } from './thrown.js'
import {
  boolean, instance, integer, object, oneOf, optionalInteger, optionalObject, rangeError, typeError, uint64, waitOptions,
} from '../../lib/core/validate.js'
import { call, closedError, fromNative, RdmaError } from '../../lib/core/errors.js'
import { Access, mtuBytes, mtuEnum, QpState, QpType, SendFlags, WcFlags, wcOpcodeNames, WrOpcode, wcStatusNames } from '../../lib/core/constants.js'
import { Resource } from '../../lib/core/resource.js'
import { completionError, Pending, type CompletionEntry, type PendingOwner } from '../../lib/ops/pending.js'
import { QP_WR_ID_BASE, WrIdAllocator } from '../../lib/ops/wr-ids.js'
import { fakeRegion } from './fake-region.js'
import { WorkQueueSlots } from '../../lib/ops/slots.js'
import { localSges } from '../../lib/verbs/local-sges.js'
import { receiveCompletion } from '../../lib/verbs/receive-completion.js'
import { NativeMemory } from '../../lib/verbs/memory.js'


describe('validate.ts: message shape', () => {
  it('typeError(): TypeError, ERR_INVALID_ARG_TYPE, "Expected X for Y but received Z"', () => {
    const e = typeError('a widget', 'options.thing', 3)
    expect(e).toBeInstanceOf(TypeError)
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(e.message).toBe('Expected a widget for options.thing but received 3')
  })

  it('rangeError(): RangeError, ERR_OUT_OF_RANGE', () => {
    const e = rangeError('an integer from 1 to 2', 'n', 7)
    expect(e).toBeInstanceOf(RangeError)
    expect(e.code).toBe('ERR_OUT_OF_RANGE')
    expect(e.message).toBe('Expected an integer from 1 to 2 for n but received 7')
  })

  class Widget {}
  it.each([
    [null, 'null'],
    [undefined, 'undefined'],
    ['abc', "'abc'"],
    ['x'.repeat(41), `'${'x'.repeat(40)}…'`],
    [12.5, '12.5'],
    [NaN, 'NaN'],
    [10n, '10n'],
    [true, 'true'],
    [() => 1, 'a function'],
    [{}, 'an instance of Object'],
    [[1], 'an instance of Array'],
    [new Widget(), 'an instance of Widget'],
    [Object.create(null), 'an instance of Object'],
    [Symbol('s'), 'symbol'],
  ])('describes %s as %s', (value, text) => {
    expect(typeError('X', 'y', value).message).toBe(`Expected X for y but received ${text}`)
  })
})

describe('validate.ts: checkers', () => {
  it('integer()', () => {
    expect(integer(5, 'n', 0, 10)).toBe(5)
    expect(integer(0, 'n', 0, 10)).toBe(0)
    expect(integer(10, 'n', 0, 10)).toBe(10)
    expect(thrown(() => integer('5', 'n', 0, 10)).code).toBe('ERR_INVALID_ARG_TYPE')
    expect(thrown(() => integer(5n, 'n', 0, 10)).code).toBe('ERR_INVALID_ARG_TYPE')
    for (const bad of [11, -1, 1.5, NaN, Infinity]) {
      const e = thrown(() => integer(bad, 'n', 0, 10))
      expect(e).toBeInstanceOf(RangeError)
      expect(e.message).toBe(`Expected an integer from 0 to 10 for n but received ${bad}`)
    }
  })

  it('optionalInteger() uses the fallback only for undefined', () => {
    expect(optionalInteger(undefined, 'n', 0, 10, 7)).toBe(7)
    expect(optionalInteger(3, 'n', 0, 10, 7)).toBe(3)
    expect(thrown(() => optionalInteger(null, 'n', 0, 10, 7)).code).toBe('ERR_INVALID_ARG_TYPE')
  })

  it('uint64()', () => {
    expect(uint64(0n, 'v')).toBe(0n)
    expect(uint64(0xffffffffffffffffn, 'v')).toBe(0xffffffffffffffffn)
    const t = thrown(() => uint64(1, 'v'))
    expect(t).toBeInstanceOf(TypeError)
    expect(t.message).toBe('Expected a bigint for v but received 1')
    const r = thrown(() => uint64(2n ** 64n, 'v'))
    expect(r).toBeInstanceOf(RangeError)
    expect(r.code).toBe('ERR_OUT_OF_RANGE')
    expect(r.message).toBe('Expected a bigint from 0 to 2^64-1 for v but received 18446744073709551616n')
    expect(thrown(() => uint64(-1n, 'v')).code).toBe('ERR_OUT_OF_RANGE')
  })

  it('object() / optionalObject()', () => {
    const o = { a: 1 }
    expect(object(o, 'o')).toBe(o)
    expect(optionalObject(undefined, 'o')).toEqual({})
    for (const bad of [null, [], 'x', 1]) expect(thrown(() => object(bad, 'o')).code).toBe('ERR_INVALID_ARG_TYPE')
    expect(thrown(() => optionalObject(null, 'o')).message).toBe('Expected an object for o but received null')
  })

  it('oneOf()', () => {
    expect(oneOf('b', 'k', ['a', 'b'])).toBe('b')
    expect(oneOf(undefined, 'k', ['a', 'b'], 'a')).toBe('a')
    const e = thrown(() => oneOf('c', 'options.kind', ['a', 'b'], 'a'))
    expect(e).toBeInstanceOf(TypeError)
    expect(e.code).toBe('ERR_INVALID_ARG_TYPE')
    expect(e.message).toBe("Expected one of 'a', 'b' for options.kind but received 'c'")
    // Without a fallback, undefined is an error.
    expect(thrown(() => oneOf(undefined, 'k', ['a'])).code).toBe('ERR_INVALID_ARG_TYPE')
  })

  it('instance()', () => {
    const d = new Date()
    expect(instance(d, 'when', Date)).toBe(d)
    expect(thrown(() => instance({}, 'when', Date)).message).toBe('Expected a Date for when but received an instance of Object')
    expect(thrown(() => instance(1, 'w', Date, 'Moment')).message).toBe('Expected a Moment for w but received 1')
  })

  it('boolean()', () => {
    expect(boolean(undefined, 'b', true)).toBe(true)
    expect(boolean(false, 'b', true)).toBe(false)
    expect(thrown(() => boolean(1, 'b', false)).message).toBe('Expected a boolean for b but received 1')
  })

  it('waitOptions()', () => {
    expect(waitOptions(undefined)).toEqual({})
    const signal = new AbortController().signal
    expect(waitOptions({ timeoutMs: 0, signal })).toEqual({ timeoutMs: 0, signal })
    expect(thrown(() => waitOptions({ timeoutMs: -1 })).message).toBe('Expected an integer from 0 to 2147483647 for options.timeoutMs but received -1')
    expect(thrown(() => waitOptions({ timeoutMs: 2 ** 31 })).code).toBe('ERR_OUT_OF_RANGE')
    expect(thrown(() => waitOptions({ signal: {} })).message).toBe('Expected a AbortSignal for options.signal but received an instance of Object')
    expect(thrown(() => waitOptions(5, 'opts')).message).toBe('Expected an object for opts but received 5')
  })
})

describe('errors.ts', () => {
  it('RdmaError carries only the details it was given', () => {
    const e = new RdmaError('write failed', { code: 'REM_ACCESS_ERR', status: 'REM_ACCESS_ERR', verb: 'write', wrId: 2 ** 40, qpn: 17, vendorError: 0x88 })
    expect(e).toBeInstanceOf(Error)
    expect(e.name).toBe('RdmaError')
    expect(e.message).toBe('write failed')
    expect(e).toMatchObject({ code: 'REM_ACCESS_ERR', status: 'REM_ACCESS_ERR', verb: 'write', wrId: 2 ** 40, qpn: 17, vendorError: 0x88 })
    for (const key of ['errno', 'syscall', 'posted', 'cause']) expect(Object.hasOwn(e, key), key).toBe(false)
    const withCause = new RdmaError('x', { code: 'ABORT_ERR', cause: 'why' })
    expect(withCause.cause).toBe('why')
  })

  it('fromNative() maps addon errors to TypeError / RangeError / RdmaError', () => {
    const typed = fromNative(Object.assign(new Error('Expected a ProtectionDomain'), { code: 'ERR_INVALID_ARG_TYPE' }))
    expect(typed).toBeInstanceOf(TypeError)
    expect((typed as any).code).toBe('ERR_INVALID_ARG_TYPE')
    expect(typed.message).toBe('Expected a ProtectionDomain')
    expect(fromNative(Object.assign(new Error('m'), { code: 'ERR_INVALID_ARG_VALUE' }))).toBeInstanceOf(TypeError)
    const range = fromNative(Object.assign(new Error('m'), { code: 'ERR_OUT_OF_RANGE' }))
    expect(range).toBeInstanceOf(RangeError)
    expect((range as any).code).toBe('ERR_OUT_OF_RANGE')
    const errno = fromNative(Object.assign(new Error('ibv_post_send: Cannot allocate memory'), { code: 'ENOMEM', errno: 12, syscall: 'ibv_post_send', posted: 3 }))
    expect(errno).toBeInstanceOf(RdmaError)
    expect(errno).toMatchObject({ code: 'ENOMEM', errno: 12, syscall: 'ibv_post_send', posted: 3, message: 'ibv_post_send: Cannot allocate memory' })
    expect(fromNative(new Error('no code'))).toMatchObject({ code: 'ERR_UNKNOWN' })
    expect(fromNative('a string')).toMatchObject({ name: 'RdmaError', code: 'ERR_UNKNOWN', message: 'a string' })
  })

  it('call() rethrows native errors converted', () => {
    expect(call(() => 5)).toBe(5)
    const e = thrown(() => call(() => { throw Object.assign(new Error('busy'), { code: 'EBUSY', errno: 16, syscall: 'ibv_dealloc_pd' }) }))
    expect(e).toBeInstanceOf(RdmaError)
    expect(e).toMatchObject({ code: 'EBUSY', errno: 16, syscall: 'ibv_dealloc_pd' })
  })

  it('closedError()', () => {
    expect(closedError('QueuePair')).toMatchObject({ name: 'RdmaError', code: 'ERR_CLOSED', message: 'QueuePair is closed' })
  })
})

describe('constants.ts (values of rdma-core enums), checked against infiniband/verbs.h', () => {
  // The C compiler reads the installed header (libibverbs-dev, which the addon
  // needs to build): every TS name maps to its C enumerator, and cc prints its value.
  const snake = (name: string) => name.replace(/([a-z])([A-Z])/g, '$1_$2').toUpperCase()
  const ours = new Map<string, number>() // C enumerator -> the value lib/core/constants.ts uses
  const want = (cName: string, value: number) => ours.set(cName, value)
  for (const [name, value] of Object.entries(Access)) want(name === 'Relaxed' ? 'IBV_ACCESS_RELAXED_ORDERING' : `IBV_ACCESS_${snake(name)}`, value)
  for (const [name, value] of Object.entries(QpType)) want(`IBV_QPT_${name}`, value)
  for (const [name, value] of Object.entries(QpState)) want(`IBV_QPS_${name}`, value)
  for (const [name, value] of Object.entries(WrOpcode)) want(`IBV_WR_${snake(name)}`, value)
  for (const [name, value] of Object.entries(SendFlags)) want(`IBV_SEND_${snake(name)}`, value)
  for (const [name, value] of Object.entries(WcFlags)) want(`IBV_WC_${snake(name)}`, value)
  for (const [value, name] of Object.entries(wcOpcodeNames)) want(`IBV_WC_${name}`, Number(value))
  wcStatusNames.forEach((name, value) => want(`IBV_WC_${name}`, value))
  for (const bytes of mtuBytes) want(`IBV_MTU_${bytes}`, mtuEnum(bytes))

  const header = '/usr/include/infiniband/verbs.h'
  let verbsH: Map<string, number>
  beforeAll(() => {
    expect(existsSync(header), `${header} (apt-get install libibverbs-dev)`).toBe(true)
    verbsH = enumValues([...ours.keys()])
  })

  it('every constant has the value verbs.h gives its enumerator', () => {
    expect(Object.fromEntries(ours), 'lib/core/constants.ts (received) vs verbs.h (expected)').toEqual(Object.fromEntries(verbsH))
  })

  it('wcStatusNames lists every ibv_wc_status, in order', () => {
    const block = readFileSync(header, 'utf8').match(/enum ibv_wc_status \{([^}]*)\}/)
    expect(block, 'enum ibv_wc_status in verbs.h').not.toBeNull()
    const names = block![1]!.split(',').map((s) => s.trim()).filter(Boolean).map((s) => s.replace(/^IBV_WC_/, ''))
    expect([...wcStatusNames]).toEqual(names)
  })

  it('mtuEnum() maps bytes to ibv_mtu and rejects others', () => {
    expect([256, 512, 1024, 2048, 4096].map(mtuEnum)).toEqual([1, 2, 3, 4, 5])
    const e = thrown(() => mtuEnum(1500))
    expect(e).toBeInstanceOf(RangeError)
    expect(e.code).toBe('ERR_OUT_OF_RANGE')
    expect(e.message).toBe('Expected one of 256, 512, 1024, 2048, 4096 for mtu but received 1500')
  })
})

// A Resource with a fake handle that logs what happens to it.
class Fake extends Resource {
  protected readonly kind = 'Fake'
  refuse = false
  constructor(readonly name: string, readonly log: string[], ...parents: Resource[]) {
    super()
    this.adoptedBy(...parents)
  }
  use(): void { this.assertOpen() }
  protected override onClose(): void {
    if (this.refuse) throw new RdmaError(`${this.name} is busy`, { code: 'ERR_BUSY' })
  }
  failHandle = false
  protected closeHandle(): void {
    if (this.failHandle) throw new RdmaError(`${this.name}: destroy refused`, { code: 'EBUSY', errno: 16, syscall: 'ibv_fake_destroy' })
    this.log.push(this.name)
  }
  untracked = false
  protected override afterClose(): void { this.untracked = true }
}

describe('Resource: lifetimes', () => {
  it('close() is idempotent and makes the object unusable with ERR_CLOSED', () => {
    const log: string[] = []
    const r = new Fake('r', log)
    expect(r.closed).toBe(false)
    r.use()
    r.close()
    r.close()
    expect(log).toEqual(['r'])
    expect(r.closed).toBe(true)
    expect(thrown(() => r.use())).toMatchObject({ name: 'RdmaError', code: 'ERR_CLOSED', message: 'Fake is closed' })
  })

  it('closing a parent closes its children first, newest first, recursively', () => {
    const log: string[] = []
    const device = new Fake('device', log)
    const pd = new Fake('pd', log, device)
    const cq = new Fake('cq', log, device)
    const mr = new Fake('mr', log, pd)
    const qp = new Fake('qp', log, pd, cq)
    device.close()
    expect(log).toEqual(['qp', 'cq', 'mr', 'pd', 'device'])
    for (const r of [device, pd, cq, mr, qp]) expect(r.closed).toBe(true)
  })

  it('a child closed on its own is forgotten by its parents', () => {
    const log: string[] = []
    const pd = new Fake('pd', log)
    const a = new Fake('a', log, pd)
    const b = new Fake('b', log, pd)
    a.close()
    pd.close()
    expect(log).toEqual(['a', 'b', 'pd'])
  })

  it('Symbol.dispose closes (the `using` declaration)', () => {
    const log: string[] = []
    const parent = new Fake('parent', log)
    {
      const child = new Fake('child', log, parent)
      child[Symbol.dispose]()
    }
    expect(log).toEqual(['child'])
    parent[Symbol.dispose]()
    expect(log).toEqual(['child', 'parent'])
  })

  it('a refusing onClose() leaves the object open and its handle alive', () => {
    const log: string[] = []
    const r = new Fake('r', log)
    r.refuse = true
    expect(thrown(() => r.close())).toMatchObject({ code: 'ERR_BUSY' })
    expect(r.closed).toBe(false)
    expect(log).toEqual([])
    r.refuse = false
    r.close()
    expect(log).toEqual(['r'])
  })

  it('a handle that refuses to close leaves the object open, tracked and usable', () => {
    const log: string[] = []
    const r = new Fake('r', log)
    r.failHandle = true
    expect(thrown(() => r.close())).toMatchObject({ code: 'EBUSY', syscall: 'ibv_fake_destroy' })
    expect(r.closed).toBe(false)
    expect(r.untracked).toBe(false)
    r.use()
    r.failHandle = false
    r.close()
    expect(r.closed && r.untracked).toBe(true)
  })

  it('a child that refuses stops the close: it and its parents stay open, the error says which', () => {
    const log: string[] = []
    const pd = new Fake('pd', log)
    const older = new Fake('older', log, pd)
    const stuck = new Fake('stuck', log, pd)
    const newer = new Fake('newer', log, pd)
    stuck.failHandle = true
    const error = thrown(() => pd.close())
    expect(error).toMatchObject({ code: 'EBUSY', syscall: 'ibv_fake_destroy', message: expect.stringMatching(/^Fake stays open: its Fake could not be closed/) })
    expect(log).toEqual(['newer']) // newest first, and nothing after the refusal
    expect([pd.closed, older.closed, stuck.closed, newer.closed]).toEqual([false, false, false, true])
    stuck.failHandle = false
    pd.close()
    expect(log).toEqual(['newer', 'stuck', 'older', 'pd'])
  })
})

describe('Pending: settling requests', () => {
  const entry = (wrId: number, status = 0): CompletionEntry => ({
    wrId, status, opcode: 0, byteLength: 0, immOrRkey: 0, qpn: 17, srcQp: 0, wcFlags: 0, pkeyIndex: 0, slid: 0, sl: 0, dlidPathBits: 0, vendorError: 0x42,
  })
  function setup(count = 1) {
    const owner = { qpn: 17, pendings: new Map<number, Pending>(), released: vi.fn(), failed: vi.fn(), orphaned: vi.fn() } satisfies PendingOwner
    const counter = { addPending: vi.fn(), removePending: vi.fn() }
    const region = fakeRegion()
    const resolve = vi.fn()
    const reject = vi.fn()
    const first = new WrIdAllocator(QP_WR_ID_BASE).take(count)
    const pending = new Pending(owner, counter, 'send', 'write', first, first + count - 1, [region], resolve, reject)
    return { owner, counter, region, resolve, reject, pending, first }
  }
  afterEach(() => { vi.useRealTimers() })

  it('tracks in-flight regions and resolves on its last completion', () => {
    const { pending, region, counter, owner, resolve, first } = setup(3)
    pending.track({})
    expect(region.inflight).toBe(1)
    expect(counter.addPending).toHaveBeenCalledTimes(1)
    expect(owner.pendings.get(first + 2)).toBe(pending)
    expect(owner.pendings.get(first)).toBeUndefined()
    expect(pending.slots).toBe(3)
    pending.complete(entry(first + 2))
    expect(resolve).toHaveBeenCalledTimes(1)
    expect(region.inflight).toBe(0)
    expect(counter.removePending).toHaveBeenCalledTimes(1)
    expect(owner.released).toHaveBeenCalledWith(pending)
    expect(owner.pendings.get(first + 2)).toBeUndefined()
  })

  it('rejects with an RdmaError named by the completion status', () => {
    const { pending, reject, owner, first } = setup()
    pending.track({})
    pending.complete(entry(first, 10))
    const error = reject.mock.calls[0]![0]
    expect(error).toBeInstanceOf(RdmaError)
    expect(error).toMatchObject({ code: 'REM_ACCESS_ERR', status: 'REM_ACCESS_ERR', verb: 'write', wrId: first, qpn: 17, vendorError: 0x42 })
    expect(error.message).toBe(`write failed: REM_ACCESS_ERR (wr_id ${first}, QP 17)`)
    expect(owner.failed).toHaveBeenCalledWith(error)
  })

  it('a flush (WR_FLUSH_ERR) rejects without failing the owner again', () => {
    const { pending, reject, owner, first } = setup()
    pending.track({})
    pending.complete(entry(first, 5))
    expect(reject.mock.calls[0]![0]).toMatchObject({ code: 'WR_FLUSH_ERR' })
    expect(owner.failed).not.toHaveBeenCalled()
  })

  it('an unknown status gets a STATUS_n name', () => {
    expect(completionError(entry(1, 99), 'send')).toMatchObject({ code: 'STATUS_99', status: 'STATUS_99' })
  })

  it('times out with ETIMEDOUT but keeps the memory in flight until the completion', () => {
    vi.useFakeTimers()
    const { pending, reject, resolve, region, first } = setup()
    pending.track({ timeoutMs: 50 })
    vi.advanceTimersByTime(49)
    expect(reject).not.toHaveBeenCalled()
    vi.advanceTimersByTime(1)
    expect(reject.mock.calls[0]![0]).toMatchObject({ name: 'RdmaError', code: 'ETIMEDOUT', verb: 'write', wrId: first, qpn: 17, message: 'write timed out after 50 ms' })
    expect(region.inflight).toBe(1) // the device may still touch the buffer
    pending.complete(entry(first))
    expect(resolve).not.toHaveBeenCalled() // settled once
    expect(region.inflight).toBe(0)
  })

  it('aborts with ABORT_ERR carrying the signal reason', () => {
    const { pending, reject } = setup()
    const controller = new AbortController()
    pending.track({ signal: controller.signal })
    controller.abort('stop')
    expect(reject).toHaveBeenCalledTimes(1)
    expect(reject.mock.calls[0]![0]).toMatchObject({ code: 'ABORT_ERR', cause: 'stop', message: 'write was aborted' })
  })

  it('untrack() undoes track() for a refused post', () => {
    const { pending, region, counter, first, owner } = setup()
    pending.track({})
    pending.untrack()
    expect(region.inflight).toBe(0)
    expect(counter.removePending).toHaveBeenCalledTimes(1)
    expect(owner.pendings.get(first)).toBeUndefined()
  })

  it('truncate() re-keys a partially posted batch by its last posted WR', () => {
    const { pending, first, owner } = setup(4)
    pending.track({})
    pending.truncate(2)
    expect(owner.pendings.get(first + 3)).toBeUndefined()
    expect(owner.pendings.get(first + 1)).toBe(pending)
    expect(pending.contains(first + 1)).toBe(true)
    expect(pending.contains(first + 2)).toBe(false)
    pending.finish()
  })
})

describe('WorkQueueSlots', () => {
  it('posts while slots are free and queues the rest in order', () => {
    const slots = new WorkQueueSlots(4)
    const order: string[] = []
    const wait = (name: string, n: number) => {
      if (slots.tryTake(n)) order.push(name)
      else slots.enqueue({ slots: n, owner: undefined, grant: () => order.push(name), reject: () => {} })
    }
    wait('a', 3)
    wait('b', 2)
    wait('c', 1) // fits, but must not overtake b
    expect(order).toEqual(['a'])
    slots.release(3)
    expect(order).toEqual(['a', 'b', 'c'])
    expect(slots.used).toBe(3)
  })

  it('fail() rejects everything still waiting', () => {
    const slots = new WorkQueueSlots(1)
    slots.used = 1
    const reject = vi.fn()
    slots.enqueue({ slots: 1, owner: undefined, grant: () => {}, reject })
    const error = new Error('qp failed')
    slots.fail(error)
    expect(reject).toHaveBeenCalledWith(error)
  })
})

describe('queue-pair helpers', () => {
  it('receiveCompletion() decodes immediate data, invalidation and GRH flags', () => {
    const base = { wrId: 9, status: 0, opcode: 128, byteLength: 100, immOrRkey: 0xdeadbeef, qpn: 3, srcQp: 4, wcFlags: 0, pkeyIndex: 0, slid: 5, sl: 1, dlidPathBits: 0, vendorError: 0 }
    // An invalidation received revokes the bind of the window it names: the callback is told its rkey.
    const revoked: number[] = []
    const invalidated = (rkey: number) => { revoked.push(rkey) }
    expect(receiveCompletion(base, invalidated)).toEqual({ byteLength: 100, opcode: 'RECV', srcQp: 4, slid: 5, sl: 1, grh: false, qpn: 3, wrId: 9 })
    expect(receiveCompletion({ ...base, opcode: 129, wcFlags: 2 | 1 }, invalidated)).toMatchObject({ opcode: 'RECV_RDMA_WITH_IMM', immediate: 0xdeadbeef, grh: true })
    expect(revoked).toEqual([])
    expect(receiveCompletion({ ...base, wcFlags: 8 }, invalidated)).toMatchObject({ invalidatedRkey: 0xdeadbeef })
    expect(revoked).toEqual([0xdeadbeef])
    expect(receiveCompletion({ ...base, wcFlags: 8 }, invalidated).immediate).toBeUndefined()
  })

  it('localSges() accepts only LocalSlices and at most maxSge of them', () => {
    expect(thrown(() => localSges({}, 'local', 1, undefined as never))).toMatchObject({ code: 'ERR_INVALID_ARG_TYPE', message: 'Expected a LocalSlice (region.slice()) for local but received an instance of Object' })
    expect(thrown(() => localSges([1, 2, 3], 'local', 2, undefined as never))).toMatchObject({ code: 'ERR_OUT_OF_RANGE', message: "Expected at most 2 slices (the queue's max SGEs) for local but received 3" })
    expect(localSges([], 'local', 1, undefined as never)).toEqual({ sges: [], regions: [], length: 0 })
  })
})

describe('NativeMemory (no device needed)', () => {
  it('is page-aligned, zero-filled and sized as asked', () => {
    const memory = new NativeMemory(10_000)
    expect(memory.size).toBe(10_000)
    expect(memory.bytes.byteLength).toBe(10_000)
    expect(memory.address % 4096).toBe(0)
    expect(memory.bytes.every((b) => b === 0)).toBe(true)
    memory.bytes[9_999] = 0xab
    expect(memory.bytes[9_999]).toBe(0xab)
  })

  it.each([
    [0, RangeError, 'ERR_OUT_OF_RANGE'],
    [-1, RangeError, 'ERR_OUT_OF_RANGE'],
    [1.5, RangeError, 'ERR_OUT_OF_RANGE'],
    [NaN, RangeError, 'ERR_OUT_OF_RANGE'],
    ['4096', TypeError, 'ERR_INVALID_ARG_TYPE'],
    [undefined, TypeError, 'ERR_INVALID_ARG_TYPE'],
  ])('rejects size %s', (size, type, code) => {
    const e = thrown(() => new NativeMemory(size as number))
    expect(e).toBeInstanceOf(type)
    expect(e.code).toBe(code)
    expect(e.message).toMatch(/ for size but received /)
  })
})

/** Compiles a C program against infiniband/verbs.h that prints each enumerator's value. */
function enumValues(names: string[]): Map<string, number> {
  const dir = mkdtempSync(join(tmpdir(), 'ibverbs-enums-'))
  try {
    const source = ['#include <stdio.h>', '#include <infiniband/verbs.h>', 'int main(void) {',
      ...names.map((n) => `  printf("%s %lld\\n", "${n}", (long long)(${n}));`), '  return 0;', '}'].join('\n')
    writeFileSync(join(dir, 'enums.c'), source)
    const cc = spawnSync('cc', ['-o', join(dir, 'enums'), join(dir, 'enums.c')], { encoding: 'utf8' })
    expect(cc.status, `cc failed: ${cc.error ?? ''}${cc.stderr}`).toBe(0)
    const run = spawnSync(join(dir, 'enums'), { encoding: 'utf8' })
    expect(run.status).toBe(0)
    return new Map(run.stdout.trim().split('\n').map((line) => {
      const [name, value] = line.split(' ')
      return [name!, Number(value)]
    }))
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
