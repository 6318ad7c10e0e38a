// Package fleet runs Relaymesh as a fleet: many simulated agents in one
// process against real `relaymesh server` processes on a real management
// kube-apiserver and etcd (test/localcluster), to measure what a platform
// team with thousands of clusters would see.
//
// Each simulated agent (Agent) is what `relaymesh agent` is on the wire, and
// nothing less:
//
//   - its own ECDSA P-256 key, generated when it bootstraps, and its own
//     source address in 127.0.0.0/8 (Linux routes all of it to lo), so the
//     server's per-peer limits see one peer per agent;
//   - Identity.Bootstrap with a real single-use token over server-only TLS
//     1.3 pinned to the relay root, with the real agent's call timeout (15 s)
//     and retry policy (1 s to 1 min, full jitter), then the same checks of
//     the answer (chain to the pinned root, clientAuth, exactly its SPIFFE
//     ID);
//   - the real agent's session loop itself (agent.Session: one mTLS
//     connection holding a Relay.Connect session with Hello, Welcome and a
//     ping every 10 s; snapshots built by discovery.Build pushed in parts on
//     PushChunked; every output set on Pull applied — here by a stand-in
//     that reports applied, unchanged and pruned per object — and
//     acknowledged; the resume ack after a reconnect; failover to the next
//     server of its list with the session backoff of 1 s to 30 s). The
//     session's hooks record what the agent saw, including any set older
//     than one it acknowledged, which the loop does not apply and the
//     server must never send.
//
// What a simulated agent does not do: it has no workload cluster, so it
// applies nothing and keeps its credential in memory (the real agent writes
// Secrets there), and it answers no shared-trust requests (no intermediate
// CA is signed). These cost the workload cluster, not the server.
//
// Tokens come from the flow the commands use: a KubernetesCluster created as
// `relaymesh cluster register` creates it, and a token minted with
// identity.Tokens over identity.KubeTokenStore in the management cluster, as
// `relaymesh token create` does; the server checks them as it checks any.
// Tokens are held in memory only and never printed.
//
// The scenarios (Storm, Issuance, Idle, ConfigPlane, LargestSnapshot) start
// their own management cluster and server, run, and return numbers with the
// evidence behind them (server CPU from /proc, metrics, log lines, API
// server request counts). The benchmarks in this package and the command
// test/cmd/fleet run them; the relaymesh binary under test is a parameter
// (-fleet.bin or RELAYMESH_BIN), so the same command measures a build
// before and after a change.
package fleet
