// Package server is the management server's side of the relay: the gRPC
// services agents call (Identity, Relay, Discovery, Trust) with their
// sessions, the cluster Registry that decides which clusters may connect,
// the View of each cluster's snapshot and its Mirror into discovery
// objects, the Outputs each agent pulls, KubernetesCluster status, and the
// in-process agents of kubeconfig mode. The wire it serves — protocol,
// connection gate, limits, snapshot framing — is package relay.
//
// Authentication (see threatmodel.md, boundary 1):
//   - Identity.Bootstrap is the only method served without a client
//     certificate; the agent pins the relay root, sends a single-use token and
//     a CSR, and the server decides the identity.
//   - Every other method requires a client certificate that chains to the
//     relay root, carries exactly one SPIFFE ID of the form
//     spiffe://<trust-domain>/cluster/<name>/agent, names a registered
//     cluster, and was issued after that cluster's current registration.
//     Deregistering a cluster ends its sessions at once.
package server
