package ca

import "errors"

// Sentinel errors. Every error returned by this package that is caused by
// its input or by a signer wraps exactly one of the first four; test with
// errors.Is. ErrNeedsRequest comes with ErrIssuance.
var (
	// ErrInvalidCSR: the certificate request is malformed, oversized, not
	// self-signed by its key, or asks for something an agent may not have
	// (a CA certificate, certificate or CRL signing) or, for a mesh
	// intermediate, anything but what the server issues (names, another
	// path length, other usages or extensions, another subject).
	ErrInvalidCSR = errors.New("invalid certificate request")
	// ErrKeyPolicy: the public key's type or size is not allowed.
	ErrKeyPolicy = errors.New("public key not allowed")
	// ErrInvalidSigner: a CA certificate, chain, root or key cannot be used
	// to sign (not a CA, expired, key mismatch, chain does not verify,
	// malformed PEM or secret data), or, for a mesh intermediate, its path
	// length constraints leave no room for another CA.
	ErrInvalidSigner = errors.New("invalid signer")
	// ErrIssuance: a certificate could not be issued, or the signer
	// returned one that differs from what was asked for.
	ErrIssuance = errors.New("certificate issuance failed")
	// ErrNeedsRequest: the signer's CA wants proof of possession (see
	// RequestSigner), and only a bare public key was given. Issue from a
	// certificate request instead (IssueAgent, IssueServerRequest).
	ErrNeedsRequest = errors.New("the certificate authority needs a certificate request signed by the subject key")
)
