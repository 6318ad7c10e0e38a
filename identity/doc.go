// Package identity holds who an agent is and how it proves it:
//
//   - SPIFFE IDs: every agent certificate names
//     `spiffe://<relay-trust-domain>/cluster/<name>/agent`, chosen by the
//     server (AgentID, ClusterFromID).
//   - Bootstrap tokens: per cluster, single-use, 256-bit secrets stored only
//     as SHA-256 hashes, consumed atomically, one opaque error for every
//     failure (Tokens, TokenStore, KubeTokenStore).
//   - The agent's credential manager: it loads `relay-client-tls-secret`,
//     bootstraps with the token when it must, renews at about 2/3 of the
//     certificate's life, and hands new connections the newest certificate
//     (Manager).
package identity
