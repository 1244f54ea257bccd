// A region as the request bookkeeping sees it: held while a work request in
// flight names it, released when the device is done with it. The count and the
// release are keyed by module-private symbols (the package exports only its
// entry), so user code cannot release a region the device still uses. The
// count is a data property, incremented where a request is recorded: as cheap
// as the plain field it replaced.
export const INFLIGHT: unique symbol = Symbol('inflight')
export const RELEASE: unique symbol = Symbol('release')

export interface HeldRegion {
  /** Work requests in flight that name this region: incremented right before one is posted. */
  [INFLIGHT]: number
  /** The device is done with a work request that named this region. */
  [RELEASE](): void
}
