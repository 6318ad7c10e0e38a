// Package agent is the agent's side of the relay: a Session dials the
// management server with the agent's certificate, holds the Connect
// session, pushes discovery snapshots (in parts, or whole to servers of
// earlier releases), applies the output sets it pulls (agent/apply) and
// the mesh CAs they ask for, and reconnects with backoff. The wire it
// speaks is package relay.
package agent
