// Package relay is the wire between the management server and the agents:
// the gRPC protocol (relay/proto), the gate that splits the relay port's
// connections at the TLS handshake into pre-authentication and
// authenticated ones (Gate, HandshakenCreds, TLSInfo, StreamGuard), the
// limits and budgets that bound what a peer may hold or spend
// (ConnectionLimits, ClusterLimits, SnapshotLimits, FailureLimiter), and
// the snapshot as it travels: its sizes (DefaultMaxSnapshotBytes and the
// rest, in one place), its hash (relay/snapshothash), its framing in parts
// — encoded by SendChunked, decoded by Assembler within a SnapshotBudget —
// and the checks it passes on arrival (ValidateSnapshot).
//
// The management server that serves these (package server) and the
// agent's session that dials it (package agent) are built on this package;
// it imports no role package (agent, server, discovery, translation,
// trust, federation, cmd), and the layering test (internal/layering) keeps
// it so.
package relay
