// Package ca is Relaymesh's certificate authority: relay identities and
// the intermediates of meshes that share trust.
//
// It issues three kinds of certificate from a [Signer], a CA key behind a
// small interface:
//
//   - agent client certificates ([Authority.IssueAgent]): short-lived,
//     clientAuth and digitalSignature only, whose only identity is a SPIFFE
//     ID URI SAN chosen by the server. Nothing but the public key is taken
//     from the agent's CSR; requested SANs are ignored and a CSR that asks
//     to become a CA is rejected.
//   - the relay server's TLS certificate ([Authority.IssueServer], or
//     [Authority.IssueServerRequest] from a certificate request): serverAuth
//     only, for DNS names and IP addresses the caller names.
//   - a mesh's intermediate CA for Istio's plugged-in CA (the cacerts
//     secret; [Authority.IssueIntermediate], requests parsed with
//     [ParseIntermediateCSR]): CA:true with pathLen 0, keyCertSign and
//     cRLSign, no extended key usage and no SAN, subject
//     O=<VirtualMesh>, CN=<mesh> intermediate, one year by default. The key
//     stays in the workload cluster; only its CSR is signed. Keys are
//     ECDSA P-256/P-384 or RSA of 3072 bits or more (what Istio can sign
//     with), and a CSR that asks for anything else — names, another path
//     length, other usages or extensions, another subject — is refused, not
//     trimmed. A signer whose chain leaves no room for one more CA level
//     (the relay CA's pathLen-0 issuing CA, for one) refuses with
//     [ErrInvalidSigner] before anything is signed. [GenerateMeshRoot]
//     makes a VirtualMesh root for it, separate from the relay CA.
//
// Every issuance is template → sign → validate the result: the template is
// built from scratch, the signer signs it, and the returned certificate is
// checked against what was asked for (chain, usage, names, key, serial,
// validity) before anyone sees it. Any difference fails closed.
//
// Signer back ends (package backend builds one from configuration):
//
//   - generated: [GenerateRelayCA] makes a self-signed root and an issuing
//     intermediate; [LoadOrCreateRelayCA] keeps them in the management
//     cluster in the secrets [RootSecretName] and [SigningSecretName].
//   - provided ("secret"): [NewKeySigner], [ParseSignerPEM] and
//     [LoadSignerFiles] take an enterprise CA certificate, its
//     intermediates, its key and the roots it chains to.
//   - pkcs11 (package hsm): a provided CA whose key stays in an HSM.
//   - cfssl and step-ca (packages cfsslca and stepca): remote CAs.
//
// Every back end passes the conformance suite in package catest, which
// also lints every certificate it issues with zlint (RFC 5280 and the
// other standards' lints, not the public web PKI's; see catest.Lint). Remote
// CAs need proof of possession and pick some fields themselves; they say so
// through two optional interfaces, [RequestSigner] (the Authority passes the
// checked certificate request along, and refuses to issue for a bare public
// key) and [LeewaySigner] (the serial number, and the validity within at
// most [MaxValidityLeeway], may be the CA's choice; every other field must
// still be exactly the template's).
//
// Errors wrap the sentinels [ErrInvalidCSR], [ErrKeyPolicy],
// [ErrInvalidSigner] and [ErrIssuance] (and [ErrNeedsRequest]); messages
// never contain key material or credentials.
// Time and randomness are injected through the Config structs.
package ca
