package debugreport

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"regexp"
	"sort"
	"sync"
)

// Redacted replaces what is taken out.
const Redacted = "REDACTED"

var (
	// pemKey is any PEM block whose type names a private key.
	pemKey = regexp.MustCompile(`(?s)-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----`)
	// jwt is a JSON Web Token (service account tokens, OIDC tokens).
	jwt = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`)
	// bootstrap is a Relaymesh bootstrap token: its id stays, its secret goes.
	bootstrap = regexp.MustCompile(`\b([0-9a-f]{16})\.[A-Za-z0-9_-]{43}\b`)
	// bearer is an Authorization header value.
	bearer = regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}`)
)

// Redactor removes secrets from what goes into the archive: private keys
// in PEM, JWTs, bootstrap token secrets, bearer tokens, and every value it
// was told of (the data of each Secret read, the token used for /debug).
type Redactor struct {
	mu     sync.Mutex
	values [][]byte
}

// minValue is the shortest value redacted by content: shorter ones would
// match too much (and a secret that short protects nothing).
const minValue = 8

// Add registers a secret value to be removed wherever it appears, as it
// is and base64-encoded. Values that are only PEM certificates are public
// and left alone.
func (r *Redactor) Add(v []byte) {
	v = bytes.TrimSpace(v)
	if len(v) < minValue || onlyCertificates(v) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.values = append(r.values, append([]byte(nil), v...), []byte(base64.StdEncoding.EncodeToString(v)))
	// Longest first, so a value containing another is removed whole.
	sort.Slice(r.values, func(i, j int) bool { return len(r.values[i]) > len(r.values[j]) })
}

// Redact returns b without secrets.
func (r *Redactor) Redact(b []byte) []byte {
	r.mu.Lock()
	values := r.values
	r.mu.Unlock()
	for _, v := range values {
		b = bytes.ReplaceAll(b, v, []byte(Redacted))
	}
	b = pemKey.ReplaceAll(b, []byte("-----"+Redacted+" $1-----"))
	b = jwt.ReplaceAll(b, []byte(Redacted))
	b = bootstrap.ReplaceAll(b, []byte("$1."+Redacted))
	b = bearer.ReplaceAll(b, []byte("${1}"+Redacted))
	return b
}

// onlyCertificates reports whether b is one or more PEM CERTIFICATE blocks
// and nothing else.
func onlyCertificates(b []byte) bool {
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return n > 0 && len(bytes.TrimSpace(b)) == 0
		}
		if block.Type != "CERTIFICATE" {
			return false
		}
		n++
	}
}
