// The fuzzers' table of argument -> expected error code. Each rule mirrors a
// check of lib/core/validate.ts (or of the class that makes it) for one
// argument: given the hostile value, it returns the code the refusal must
// carry, or undefined where the value is acceptable to that check (then the
// call may go on and succeed or fail for another reason, which is not
// checked). Precedence between a closed object and a bad argument is each
// call's own, so the call sites say which comes first (see 95 and 107).
import { writeSync } from 'node:fs'

export const TYPE = 'ERR_INVALID_ARG_TYPE'
export const RANGE = 'ERR_OUT_OF_RANGE'
export const CLOSED = 'ERR_CLOSED'

/** Expected code for a value, or undefined: the value passes this check. */
export type Rule = (value: unknown) => string | undefined

/** validate.integer(): a non-number is a type error; a non-integer or one outside [min, max] is out of range. */
export const int = (min: number, max: number): Rule => (v) =>
  typeof v !== 'number' ? TYPE : !Number.isInteger(v) || v < min || v > max ? RANGE : undefined
/** validate.optionalInteger(): undefined takes the default. */
export const optInt = (min: number, max: number): Rule => (v) => v === undefined ? undefined : int(min, max)(v)
/** validate.integer() behind `value ?? fallback`: null takes the fallback as undefined does. */
export const nullishInt = (min: number, max: number): Rule => (v) => v === undefined || v === null ? undefined : int(min, max)(v)
/** validate.uint64() (and u64.smallU64()): a bigint 0 .. 2^64-1. */
export const u64: Rule = (v) => typeof v !== 'bigint' ? TYPE : v < 0n || v > 0xffffffffffffffffn ? RANGE : undefined
/** validate.object(): arrays and null are not objects. */
export const obj: Rule = (v) => typeof v !== 'object' || v === null || Array.isArray(v) ? TYPE : undefined
/** validate.optionalObject(). */
export const optObj: Rule = (v) => v === undefined ? undefined : obj(v)
/** validate.instance(): `type` only (the hostile values are never one). */
export const inst = (type: abstract new (...args: never[]) => unknown): Rule => (v) => v instanceof type ? undefined : TYPE
export const optInst = (type: abstract new (...args: never[]) => unknown): Rule => (v) => v === undefined ? undefined : inst(type)(v)
/** A function or undefined (setCompletionHandler, hooks). */
export const optFn: Rule = (v) => v === undefined || typeof v === 'function' ? undefined : TYPE
/** cm privateData(): a Uint8Array of at most `max` bytes. */
export const privateData = (max: number): Rule => (v) =>
  v === undefined ? undefined : !(v instanceof Uint8Array) ? TYPE : v.length > max ? RANGE : undefined
/** validate.oneOf() with a fallback. */
export const optOneOf = (choices: readonly string[]): Rule => (v) => v === undefined || (typeof v === 'string' && choices.includes(v)) ? undefined : TYPE
/** A value only some class accepts (the hostile values are none of them). */
export const always = (code: string): Rule => () => code

/** The checked calls' tallies, and the mismatches found (each one fails the run). */
export class CodeChecks {
  checked = 0
  readonly byCall = new Map<string, number>()
  readonly mismatches: Error[] = []

  /** Compares a call's outcome (an error, or 'accepted') with the code expected for its hostile argument ('A|B': either). */
  compare(call: string, argument: string, value: unknown, expected: string | undefined, outcome: unknown): void {
    if (expected === undefined) return
    this.checked++
    this.byCall.set(call, (this.byCall.get(call) ?? 0) + 1)
    const actual = outcome === ACCEPTED ? 'accepted (no error)' : String((outcome as { code?: unknown })?.code ?? `uncoded ${String(outcome)}`)
    if (expected.split('|').includes(actual)) return // 'A|B': either (the state may change while the call waits)
    const shown = outcome instanceof Error ? ` (${outcome.message})` : ''
    const failure = new Error(`${call}: argument ${argument} = ${show(value)}: expected code ${expected}, got ${actual}${shown}`, { cause: outcome })
    writeSync(2, `fuzz code mismatch: ${failure.message}\n`)
    this.mismatches.push(failure)
  }

  summary(): string {
    return `${this.checked} refusals checked against the code table (${[...this.byCall].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(', ')})`
  }
}

/** The outcome of a call that returned or resolved. */
export const ACCEPTED = Symbol('accepted')

export function show(value: unknown): string {
  try {
    if (typeof value === 'bigint') return `${value}n`
    if (typeof value === 'string') return JSON.stringify(value)
    if (Array.isArray(value)) return `[${value.length === 0 ? '' : '…'}]`
    if (typeof value === 'object' && value !== null) return `${(value as object).constructor?.name ?? 'Object'} ${JSON.stringify(value)?.slice(0, 60) ?? ''}`
    return String(value)
  } catch {
    return typeof value
  }
}
