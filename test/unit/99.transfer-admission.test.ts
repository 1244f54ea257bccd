// Who may connect: the transcript and proofs of options.admission (pure,
// lib/transfer/admission.ts), then the handshake over TCP on loopback:
// test/engine/admission-suite.ts with 'tcp' (test/rdma/106 runs it with
// 'rdma'), its hand-made client a socket that speaks the TCP link's frames.
import { describe, expect, it } from 'vitest'
import { connect } from 'node:net'
import { TransferAgent } from '../../dist/index.js'
import { admissionSettings, ConnectorGate, ListenerGate, proof, Refusal, verifyProof, type Transcript } from '../../lib/transfer/admission.js'
import { TcpChannel } from '../../dist/transfer/tcp/channel.js'
import { admissionTests } from '../engine/admission-suite.js'

admissionTests({ transport: 'tcp', host: '127.0.0.1' }, async (port) => {
  const socket = connect({ host: '127.0.0.1', port })
  await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject) })
  const channel = new TcpChannel(socket, () => undefined)
  return { channel, hello: { t: 'hello', p: 2, tcp: 1, lanes: 1 }, close: () => channel.close() }
})

describe('admission: the transcript and its proofs (pure)', () => {
  const key = admissionSettings({ secret: 'a secret of at least sixteen bytes' })!.key!
  const base: Transcript = {
    transport: 'rdma', clientNonce: Buffer.alloc(32, 1), serverNonce: Buffer.alloc(32, 2),
    client: { agent: 'c-id', name: 'client' }, server: { agent: 's-id', name: 'server' },
  }
  const b64 = (bytes: Buffer) => bytes.toString('base64')

  it('a proof is HMAC-SHA256 (32 bytes), the same for the same transcript and key, and verifies', () => {
    const p = proof(key, 'listener', base)
    expect(p.length).toBe(32)
    expect(proof(key, 'listener', { ...base, clientNonce: Buffer.alloc(32, 1) }).equals(p)).toBe(true)
    expect(verifyProof(key, 'listener', base, b64(p))).toBe(true)
  })

  it('every part of the transcript counts: each nonce, each agent id and name, the transport, the key', () => {
    const p = b64(proof(key, 'listener', base))
    const variants: Transcript[] = [
      { ...base, clientNonce: Buffer.alloc(32, 3) },
      { ...base, serverNonce: Buffer.alloc(32, 3) },
      { ...base, client: { agent: 'other', name: 'client' } },
      { ...base, client: { agent: 'c-id', name: 'other' } },
      { ...base, server: { agent: 'other', name: 'server' } },
      { ...base, server: { agent: 's-id', name: 'other' } },
      { ...base, transport: 'tcp' },
      // Parts are length-prefixed: moving a byte from one name to the next is another transcript.
      { ...base, client: { agent: 'c-i', name: 'dclient' } },
    ]
    for (const t of variants) expect(verifyProof(key, 'listener', t, p)).toBe(false)
    const other = admissionSettings({ secret: 'another secret, sixteen bytes +' })!.key!
    expect(verifyProof(other, 'listener', base, p)).toBe(false)
  })

  it('a reflected proof does not pass: the listener\'s proof is not the connector\'s', () => {
    expect(verifyProof(key, 'connector', base, b64(proof(key, 'listener', base)))).toBe(false)
    expect(proof(key, 'connector', base).equals(proof(key, 'listener', base))).toBe(false)
  })

  it('anything but 32 bytes of base64 is a wrong proof, never a throw', () => {
    const p = b64(proof(key, 'connector', base))
    for (const bad of [undefined, null, 42, '', 'x', p.slice(0, -2), p + 'AA', ' ' + p, Buffer.alloc(32).toString('hex'), { p }]) {
      expect(verifyProof(key, 'connector', base, bad)).toBe(false)
    }
  })

  it('a whole handshake by the two gates: admitted with the same secret, refused otherwise; the secret is in no message', () => {
    const secret = 'the secret that must not travel'
    const run = (clientSecret: string | undefined, serverSecret: string | undefined, allow?: string[]) => {
      const client = new ConnectorGate(admissionSettings(clientSecret ? { secret: clientSecret } : undefined), 'tcp', { agent: 'c-id', name: 'client' })
      const server = new ListenerGate(admissionSettings(serverSecret || allow ? { secret: serverSecret, allow } : undefined), 'tcp', { agent: 's-id', name: 'server' },
        { agent: 'c-id', name: 'client', ...client.hello() })
      const wire: unknown[] = [client.hello()]
      const early = server.atHello()
      if (early) return { refused: 'server at hello', why: early.message.why, wire }
      const welcome = { agent: 's-id', name: 'server', ...server.welcome() }
      wire.push(welcome)
      const answer = client.answer(welcome, 'there')
      if (answer instanceof Refusal) return { refused: 'client', why: answer.message.why, wire }
      if (!server.proving) return { refused: undefined, wire }
      wire.push(answer)
      const late = server.checkProof(answer ?? {})
      return late ? { refused: 'server at proof', why: late.message.why, wire } : { refused: undefined, wire }
    }
    const ok = run(secret, secret)
    expect(ok.refused).toBeUndefined()
    expect(ok.wire).toHaveLength(3)
    expect(run(secret, 'another secret of sixteen bytes')).toMatchObject({ refused: 'client', why: 'secret' })
    expect(run(undefined, secret)).toMatchObject({ refused: 'server at hello', why: 'secret' })
    expect(run(secret, undefined)).toMatchObject({ refused: 'client', why: 'secret' })
    expect(run(secret, secret, ['someone'])).toMatchObject({ refused: 'server at proof', why: 'name' })
    expect(run(secret, secret, ['client']).refused).toBeUndefined()
    expect(run(undefined, undefined, ['someone'])).toMatchObject({ refused: 'server at hello', why: 'name' })
    expect(run(undefined, undefined, ['client']).refused).toBeUndefined()
    const text = JSON.stringify(ok.wire)
    for (const form of [secret, Buffer.from(secret).toString('base64'), Buffer.from(secret).toString('hex')]) expect(text).not.toContain(form)
  })

  it('options.admission is checked once: coded errors for a bad shape, a short secret, a bad allow-list', async () => {
    expect(admissionSettings(undefined)).toBeUndefined()
    expect(() => admissionSettings({})).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(() => admissionSettings('secret')).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(() => admissionSettings({ secret: 42 })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(() => admissionSettings({ secret: 'short' })).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(() => admissionSettings({ secret: new Uint8Array(15) })).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }))
    expect(() => admissionSettings({ allow: 'peer' })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(() => admissionSettings({ allow: ['peer', 7] })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }))
    expect(admissionSettings({ allow: [] })!.allow!.size).toBe(0)
    // The caller's bytes are copied: changing them later changes nothing.
    const bytes = new Uint8Array(32).fill(9)
    const a = admissionSettings({ secret: bytes })!.key!
    bytes.fill(1)
    const t: Transcript = { transport: 'tcp', clientNonce: Buffer.alloc(32), serverNonce: Buffer.alloc(32), client: { agent: 'a', name: 'a' }, server: { agent: 'b', name: 'b' } }
    expect(proof(a, 'listener', t).equals(proof(admissionSettings({ secret: new Uint8Array(32).fill(9) })!.key!, 'listener', t))).toBe(true)
    // And through create(): refused before anything opens.
    await expect(TransferAgent.create({ host: '127.0.0.1', transport: 'tcp', admission: { secret: 'short' } })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' })
  })
})
