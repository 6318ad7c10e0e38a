// Package relay is the wire between the management server and the agents:
// the gRPC protocol (relay/proto), the server that authenticates agents and
// holds their sessions, the agent's session client, and the cluster registry
// that decides which clusters may connect.
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
package relay
