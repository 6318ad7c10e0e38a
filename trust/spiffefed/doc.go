// Package spiffefed publishes the trust bundles of Relaymesh's VirtualMeshes
// per the SPIFFE Trust Domain and Bundle and the SPIFFE Federation specs:
// one bundle (a JWK Set with x5c, use "x509-svid", spiffe_sequence and
// spiffe_refresh_hint) per trust domain, never one bundle for several trust
// domains, served over HTTPS at PathPrefix + <trust domain> with GET only
// and no client authentication.
//
// It is pure: Next decides the published State from the trust requests the
// trust controller published (Member) and the State stored before, Encode
// and Decode are the State's stored form, NewSnapshot renders the
// documents, and Handler serves them. Where the State is stored, who may
// write it and which certificate the endpoint is served with is the
// caller's (server/app).
//
// Sequence numbers come from the stored State, never from one process's
// memory: every change of a trust domain's roots takes
// max(State.Counter+1, now in Unix seconds), and Counter keeps the highest
// ever given, so a sequence never goes backwards across restarts and
// replicas, a trust domain removed and published again continues above
// its last sequence, and a lost store starts again above every sequence
// given before it (as long as fewer than one change per second happened on
// average, which root rotations are far from).
package spiffefed
