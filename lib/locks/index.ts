// Lock tables on one-sided atomics (docs/locks.md).
export { RemoteLockTable } from './lock-table.js'
export type { RemoteLockTableOptions, LockWaitOptions, LockGrant, LockMode } from './lock-table.js'
export { heldWord, decodeWord } from './lock-word.js'
