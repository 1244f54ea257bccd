// Cluster metadata: agents publish themselves in etcd (a record per agent,
// held by a lease) and watch the others; see docs/cluster.md.
export { EtcdRegistry } from './registry.js'
export type { MetadataState, MetadataStateEvent, PeerLeftEvent, PeerLeftReason, RegistryEvents, SelfRecord } from './registry.js'
export { metadataSettings, METADATA_DEFAULTS } from './options.js'
export type { MetadataOptions, MetadataSetting, MetadataSettings } from './options.js'
export { decodeRecord, encodeRecord, isAgentName, isPeerRecord, NAME_RULE, RECORD_FORMAT } from './record.js'
export type { PeerAddress, PeerRecord } from './record.js'
export { EtcdClient } from './etcd-client.js'
export type { EtcdEndpoint, EtcdKeyValue, EtcdWatch, EtcdWatchEvent, EtcdWatchHandlers } from './etcd-client.js'
