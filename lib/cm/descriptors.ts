// Memory descriptors packed into rdma_cm private data.
import { integer, rangeError, typeError } from '../core/validate.js'

const MAGIC = [0x4e, 0x49, 0x42] // 'NIB'
const ENTRY = 20

/** Packs remote descriptors into bytes for private data: 4 + 20 per descriptor (2 fit a connect request, 9 an accept). */
export function encodeDescriptors(descriptors: ReadonlyArray<{ addr: string; rkey: number; length: number }>): Buffer<ArrayBuffer> {
  if (!Array.isArray(descriptors)) throw typeError('an array of descriptors', 'descriptors', descriptors)
  const out = Buffer.alloc(4 + ENTRY * descriptors.length)
  out.set(MAGIC, 0)
  out[3] = descriptors.length
  descriptors.forEach((d, i) => {
    const at = 4 + i * ENTRY
    out.writeUInt32LE(integer(d.rkey, `descriptors[${i}].rkey`, 0, 0xffffffff), at)
    out.writeBigUInt64LE(BigInt(d.addr), at + 4)
    out.writeBigUInt64LE(BigInt(integer(d.length, `descriptors[${i}].length`, 0, Number.MAX_SAFE_INTEGER)), at + 12)
  })
  return out
}

/** Unpacks descriptors packed by encodeDescriptors (ignores the CM's zero padding). */
export function decodeDescriptors(bytes: Uint8Array | undefined): Array<{ version: 1; addr: string; rkey: number; length: number }> {
  if (!(bytes instanceof Uint8Array)) throw typeError('a Buffer', 'bytes', bytes)
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (b.length < 4 || b[0] !== MAGIC[0] || b[1] !== MAGIC[1] || b[2] !== MAGIC[2]) throw typeError('descriptors packed by encodeDescriptors', 'bytes', bytes)
  const count = b[3]!
  if (b.length < 4 + count * ENTRY) throw rangeError(`${4 + count * ENTRY} bytes for ${count} descriptors`, 'bytes.length', b.length)
  return Array.from({ length: count }, (_, i) => {
    const at = 4 + i * ENTRY
    return { version: 1 as const, rkey: b.readUInt32LE(at), addr: '0x' + b.readBigUInt64LE(at + 4).toString(16), length: Number(b.readBigUInt64LE(at + 12)) }
  })
}
