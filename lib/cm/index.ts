// rdma_cm: connections by IP address and port (listen/accept/reject, connect
// with private data and timeouts, disconnect), and JSON messages over them.
export { connect, Connection } from './connection.js'
export { listen, ConnectionRequest, Listener } from './listener.js'
export { encodeDescriptors, decodeDescriptors } from './descriptors.js'
/** @internal A promise bounded by a timeout and an AbortSignal (for the transfer engine). */
export { bounded } from './channel.js'
export type { ConnectionOptions, ListenOptions, ConnectionSetup, QpCaps, AcceptOptions, RejectOptions, CmAddress, ConnectionEvents, ListenerEvents } from './options.js'
