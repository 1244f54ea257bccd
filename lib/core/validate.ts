// Argument checks with one message shape: "Expected X for Y but received Z".
type CodedError = Error & { code: string }

/** A value as an error message shows it (never throws: bigints, symbols, null-prototype objects too). */
export function describeValue(value: unknown): string {
  if (value === null) return 'null'
  if (typeof value === 'string') return `'${value.length > 40 ? value.slice(0, 40) + '…' : value}'`
  if (typeof value === 'number' || typeof value === 'bigint' || typeof value === 'boolean') return `${String(value)}${typeof value === 'bigint' ? 'n' : ''}`
  if (typeof value === 'function') return 'a function'
  if (typeof value === 'object') return `an instance of ${(value as object).constructor?.name ?? 'Object'}`
  return typeof value
}

export function typeError(expected: string, name: string, value: unknown): CodedError {
  return Object.assign(new TypeError(`Expected ${expected} for ${name} but received ${describeValue(value)}`), { code: 'ERR_INVALID_ARG_TYPE' })
}

export function rangeError(expected: string, name: string, value: unknown): CodedError {
  return Object.assign(new RangeError(`Expected ${expected} for ${name} but received ${describeValue(value)}`), { code: 'ERR_OUT_OF_RANGE' })
}

/** A message over what its channel holds: a RangeError (as before it had a code) with code ERR_MESSAGE_TOO_LARGE. */
export function tooLarge(message: string): CodedError {
  return Object.assign(new RangeError(message), { code: 'ERR_MESSAGE_TOO_LARGE' })
}

/** The default options object: hot paths compare against it to skip option parsing (one object, shared by every module). */
export const NO_OPTIONS: Readonly<Record<string, never>> = Object.freeze({})

/** A slice's `offset` and `length` inside `total` bytes (ERR_INVALID_ARG_TYPE / ERR_OUT_OF_RANGE otherwise). */
export function sliceBounds(offset: unknown, length: unknown, total: number): void {
  integer(offset, 'offset', 0, total)
  integer(length, 'length', 0, total - (offset as number))
}

export function integer(value: unknown, name: string, min: number, max: number): number {
  if (typeof value !== 'number') throw typeError('an integer', name, value)
  if (!Number.isInteger(value) || value < min || value > max) throw rangeError(`an integer from ${min} to ${max}`, name, value)
  return value
}

export function optionalInteger(value: unknown, name: string, min: number, max: number, fallback: number): number {
  return value === undefined ? fallback : integer(value, name, min, max)
}

export function uint64(value: unknown, name: string): bigint {
  if (typeof value !== 'bigint') throw typeError('a bigint', name, value)
  if (value < 0n || value > 0xffffffffffffffffn) throw rangeError('a bigint from 0 to 2^64-1', name, value)
  return value
}

export function object(value: unknown, name: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw typeError('an object', name, value)
  return value as Record<string, unknown>
}

export function optionalObject(value: unknown, name: string): Record<string, unknown> {
  return value === undefined ? {} : object(value, name)
}

export function oneOf<T extends string>(value: unknown, name: string, choices: readonly T[], fallback?: T): T {
  if (value === undefined && fallback !== undefined) return fallback
  if (typeof value !== 'string' || !choices.includes(value as T)) throw typeError(`one of ${choices.map((c) => `'${c}'`).join(', ')}`, name, value)
  return value as T
}

export function instance<T>(value: unknown, name: string, type: abstract new (...args: never[]) => T, typeName = type.name): T {
  if (!(value instanceof type)) throw typeError(`a ${typeName}`, name, value)
  return value
}

export function boolean(value: unknown, name: string, fallback: boolean): boolean {
  if (value === undefined) return fallback
  if (typeof value !== 'boolean') throw typeError('a boolean', name, value)
  return value
}

export interface WaitOptions { timeoutMs?: number; signal?: AbortSignal }

export function waitOptions(value: unknown, name = 'options'): WaitOptions {
  const o = optionalObject(value, name)
  const result: WaitOptions = {}
  if (o.timeoutMs !== undefined) result.timeoutMs = integer(o.timeoutMs, `${name}.timeoutMs`, 0, 2 ** 31 - 1)
  if (o.signal !== undefined) result.signal = instance(o.signal, `${name}.signal`, AbortSignal)
  return result
}
