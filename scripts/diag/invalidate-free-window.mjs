// Invalidates a type 2 memory window that was never bound. Before the
// library refused this (ERR_WINDOW_NOT_BOUND), the LOCAL_INV reached the
// device, and Linux 6.1's rxe dereferences NULL for it (rxe_do_invalidate_mw
// drops the references of a bind that never happened): the guest resets.
// node scripts/diag/invalidate-free-window.mjs   (only in a throwaway guest)
import { openDevice, Access } from '../../dist/index.js'

const device = openDevice(process.env.SOFTROCE_DEVICE || undefined)
const pd = device.allocPd()
const cq = device.createCq()
const a = pd.createQp({ type: 'RC', sendCq: cq })
const b = pd.createQp({ type: 'RC', sendCq: cq })
await a.connect(b.endpoint())
await b.connect(a.endpoint())
const window = pd.allocMemoryWindow(2)
console.log(`window rkey ${window.rkey}, never bound: posting LOCAL_INV of it`)
try {
  await a.invalidate(window.rkey, { timeoutMs: 5000 })
  console.log('completed')
} catch (error) {
  console.log('refused:', error.code, error.message)
}
device.close()
