// Package relay is the wire between the management server and the agents:
// the gRPC protocol (relay/proto), the server and agent transports, and the
// interceptors that map an mTLS peer certificate to a registered cluster and
// reject everything else.
//
// Status: not yet implemented; the agent-trust and relay data path issues
// build it.
package relay
