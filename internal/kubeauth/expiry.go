package kubeauth

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"time"
)

// maxClaimsBytes bounds the claims part of a token Expiry reads.
const maxClaimsBytes = 8 << 10

// Expiry returns when a token stops being valid, read from its `exp` claim
// when it is a JWT (service account and OIDC tokens are), and false when it
// names none (an opaque token, or one Expiry cannot read).
//
// The claim is read WITHOUT verifying the signature: the answer only
// shortens how long a caller keeps a token the apiserver already accepted
// (a session ends no later than its token), and MUST NOT be used to accept
// one.
func Expiry(token string) (time.Time, bool) {
	if len(token) > MaxTokenBytes {
		return time.Time{}, false
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(parts[1]) > base64.RawURLEncoding.EncodedLen(maxClaimsBytes) {
		return time.Time{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	// A JSON number only (RFC 7519 NumericDate): a string, even of
	// digits, is no expiry.
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	// Seconds since the epoch, up to far beyond any token: anything else
	// is no expiry Expiry can name.
	f := *claims.Exp
	if math.IsNaN(f) || f < 0 || f > 1<<40 {
		return time.Time{}, false
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), true
}
