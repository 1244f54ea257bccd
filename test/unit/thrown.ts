// The error a function throws (fails the test if it does not throw).
export function thrown(fn: () => unknown): any { // eslint-disable-line @typescript-eslint/no-explicit-any
  try {
    fn()
  } catch (error) {
    return error
  }
  throw new Error('expected a throw')
}
