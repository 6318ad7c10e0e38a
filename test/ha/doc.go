// Package ha runs several `relaymesh server` replicas as real processes
// against one management cluster (real etcd and kube-apiserver processes from
// test/localcluster), sharing one namespace, the way the server chart runs
// them behind one Service.
//
// Each replica runs in a network namespace of its own, with its own address
// on a private bridge, its own relay and metrics ports and its own audit log.
// The replicas reach the management apiserver only through a store namespace
// on that bridge, so Network.CutAPIServer can cut one replica off from the
// apiserver (silently, in both directions, as a partition would) while agents
// still reach it, and RestoreAPIServer heals the cut. Agents, the CLI and the
// tests' gRPC clients run in the root namespace and reach every replica on
// the bridge. Only addresses of the network the harness made, and
// 127.0.0.0/8, are ever used.
//
// Everything is tested through processes (the relaymesh binary) and the wire
// (relay/proto), never through the server's Go API, so the tests hold while
// the server's code moves between packages.
//
// The harness needs root (network namespaces) and iproute2's ip.
package ha
