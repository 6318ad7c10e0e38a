// Package trust gives the meshes of a VirtualMesh shared trust: one root
// per VirtualMesh (spec.mtls.shared), and for each member mesh an
// intermediate CA whose key is generated in the mesh's own cluster and never
// leaves it.
//
// The server side (Controller) asks each cluster's agent, through the output
// stream (relay OutputSet.trust), to keep the cacerts Secret of each of its
// meshes issued from the VirtualMesh's root and carrying its root bundle,
// and signs the intermediates agents ask for (Trust.SignIntermediate) after
// checking that the mesh is in the caller's cluster and belongs to a valid
// VirtualMesh with shared trust.
//
// The agent side (Agent) generates the key, sends only a CSR, checks the
// answer (a CA limited to path length 0, for its key, chaining to the root
// the request names) and writes Istio's plugged-in CA Secret `cacerts`
// (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) in the mesh's
// namespace, as a kubelet would mount it into istiod. It renews the
// intermediate once renewAtPercent of its life is gone (default 66%), never
// touches a cacerts Secret it did not create, and deletes the ones it
// manages that are no longer asked for.
//
// When the VirtualMesh names another root, the Controller rotates every mesh
// to it (MultiRoot): both roots in the bundle with old intermediates, both
// with new intermediates, the new root only, Finished; each step is recorded
// in the VirtualMesh status before it is published and moves on only once
// every mesh's agent acked the one before (and, with Manual verification,
// once continue was asked). Rollback walks the steps back. A root that
// cannot be loaded holds the meshes' CAs (TrustRequest.hold) instead of
// letting agents prune them. With autoRestartPods the agent restarts istiod,
// then the injected workloads, after a CA change.
package trust
