// The transfer engine over TCP, on loopback with no device: the engine's
// shared suite (test/engine/) with transport 'tcp', then what is TCP's own.
import { engineAgents, engineTests } from '../engine/transfer-suite.js'
import type { EngineEnv } from '../engine/util.js'

const env: EngineEnv = { transport: 'tcp', host: '127.0.0.1' }
const ctx = engineAgents(env)
engineTests(env, ctx)
