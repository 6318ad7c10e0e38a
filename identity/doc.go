// Package identity holds who an agent is and how it proves it: SPIFFE IDs
// (`spiffe://<relay-trust-domain>/cluster/<name>/agent`), single-use bootstrap
// tokens stored only as hashes, and the agent's credential manager that
// stores, renews and, when it must, re-bootstraps the client certificate.
//
// Status: not yet implemented; the agent-trust issue builds it.
package identity
