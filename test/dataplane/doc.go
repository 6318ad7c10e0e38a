// Package dataplane runs a real xDS data plane for Relaymesh's tests:
// proxyless gRPC workloads (gRPC-Go's xDS client and server) fed by a real
// istiod (test/istiod) over xDS, with workload certificates from that
// istiod's CA. No Envoy binary exists on the machines the tests run on;
// gRPC-Go's xDS implementation is the data plane, and what istiod's `grpc`
// generator sends it (listeners, routes with weights, header matches, fault
// injection, timeouts, RBAC from AuthorizationPolicy, TLS from certificate
// providers) is what the traffic tests prove. docs/dataplane.md says which
// Relaymesh features proxyless clients can and cannot show.
//
// A Cluster is one workload cluster of test/localcluster with its istiod.
// Everything a kubelet or controller-manager would do there is done by the
// harness as API calls: a Workload is a ServiceAccount, a Pod whose status
// (podIP, Running, Ready) the harness writes through the status
// subresource, and an EndpointSlice per Service that selects it. Each
// Workload binds its own loopback address (Linux routes all of 127/8 to lo)
// and names it in its xDS node id (`sidecar~IP~pod.ns~ns.svc.cluster.local`)
// with GENERATOR=grpc metadata, so istiod finds the Pod, its labels and its
// service account, exactly as for a pod in a real cluster.
//
// Certificates come from istiod's CA the way istio-agent gets them: a
// TokenRequest token for the Pod's service account and a CSR. The harness
// writes them as files (cert chain, key, root bundle) that gRPC's
// file_watcher certificate provider reads and reloads, so a test can
// re-issue them (a root rotation) while traffic flows.
//
// The xDS stream is plaintext on loopback, as between a proxyless
// application and its local istio-agent; the agent-to-istiod leg (TLS and a
// token) is not part of this data plane. Servers serve only once istiod has
// sent their inbound listener (gRPC's xDS server starts NOT_SERVING), and
// clients count every RPC's outcome by status code and by the workload,
// subset and cluster that answered (Outcomes).
package dataplane
