// Package relaytrust recognizes an agent's broken relay trust — the server
// not under the relay root it pins, or its certificate refused as from an
// issuer the server does not trust — and names the recovery. It imports
// nothing but the standard library, so the agent's session and its
// credential manager share it without the session importing identity.
package relaytrust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// RebootstrapCommand is the documented recovery of an agent whose relay
// trust is broken: a new token and the current relay roots, written into
// its cluster without deregistering it.
func RebootstrapCommand(cluster string) string {
	return "relaymesh cluster re-bootstrap " + cluster
}

// Reason says why an agent can no longer reach the relay server
// when err shows its relay trust is broken — the server's certificate
// does not chain to the relay root the agent pins, or the server refused
// the agent's certificate as from an issuer it does not trust (unknown
// or expired) — and what to run; "" for any other error. These are what
// an agent that was offline while the relay root rotated (or past its
// certificate's lifetime) meets, and only a new bootstrap token and the
// current roots (RebootstrapCommand) end them: retrying does not.
//
// The errors arrive typed from a handshake (x509.UnknownAuthorityError),
// or only as text: a TLS alert from the server is an unexported type of
// crypto/tls, and gRPC keeps only the message of a transport's error in
// its status. Both are recognized, by type first and by the fixed
// messages of crypto/x509 and crypto/tls second.
func Reason(cluster string, err error) string {
	if err == nil {
		return ""
	}
	switch relayTrustCause(err) {
	case serverUntrusted:
		return fmt.Sprintf("the relay server's certificate does not chain to the pinned relay root; the relay root was probably rotated while this agent was offline: run `%s`", RebootstrapCommand(cluster))
	case clientUntrusted:
		return fmt.Sprintf("the relay server refused this agent's certificate as from an issuer it does not trust (expired, or under a relay root that was rotated while this agent was offline): run `%s`", RebootstrapCommand(cluster))
	}
	return ""
}

type trustCause int

const (
	trustFine trustCause = iota
	serverUntrusted
	clientUntrusted
)

// The texts of these errors: the client's own verification of the server,
// and the alerts a crypto/tls server sends for a client certificate under
// a root it does not hold (alertUnknownCA) or expired
// (alertCertificateExpired), as the client reads them.
const (
	msgUnknownAuthority = "x509: certificate signed by unknown authority"
	msgRemoteUnknownCA  = "remote error: tls: unknown certificate authority"
	msgRemoteExpired    = "remote error: tls: expired certificate"
)

func relayTrustCause(err error) trustCause {
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return serverUntrusted
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, msgUnknownAuthority):
		return serverUntrusted
	case strings.Contains(msg, msgRemoteUnknownCA), strings.Contains(msg, msgRemoteExpired):
		return clientUntrusted
	}
	return trustFine
}
