package check

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
)

// Thresholds of certificate expiry.
const (
	// WarnBefore and ErrorBefore apply to CAs a person rotates (the relay
	// root and issuing CA, VirtualMesh roots): a warning under 30 days to
	// expiry, an error under 7.
	WarnBefore  = 30 * 24 * time.Hour
	ErrorBefore = 7 * 24 * time.Hour
)

// Lifetime describes a certificate for an expiry verdict.
type Lifetime struct {
	// What the certificate is, for the message ("relay root CA").
	What string
	// NotBefore may be zero when unknown.
	NotBefore, NotAfter time.Time
	// RenewAt is the fraction of the lifetime at which software renews the
	// certificate (2/3 for agent certificates); zero for certificates a
	// person rotates.
	RenewAt float64
	// Foreign is true for a certificate another party rotates (a foreign
	// trust domain's root): nothing here can replace it, so it is only a
	// warning under ErrorBefore, for its owner to hear of, and an error
	// once expired.
	Foreign bool
}

// Expiry judges how close a certificate is to expiry at now.
//
// Certificates a person rotates: a warning under WarnBefore, an error under
// ErrorBefore. Certificates software renews (RenewAt > 0) are judged
// against their lifetime, since a 24-hour agent certificate always has
// fewer than 30 days left: with q the fraction of the lifetime left at the
// renewal point, a warning under min(WarnBefore, 3/4·q·lifetime) — the
// renewal is overdue — and an error under min(ErrorBefore, 3/10·q·lifetime).
// Foreign certificates: a warning under ErrorBefore. An expired
// certificate is always an error, one not yet valid a warning.
func Expiry(l Lifetime, now time.Time) (Severity, string) {
	left := l.NotAfter.Sub(now)
	if left <= 0 {
		return Error, fmt.Sprintf("%s expired %s ago (%s)", l.What, duration.HumanDuration(-left), l.NotAfter.UTC().Format(time.RFC3339))
	}
	if !l.NotBefore.IsZero() && now.Before(l.NotBefore) {
		return Warning, fmt.Sprintf("%s is not valid until %s (in %s): is a clock wrong?", l.What, l.NotBefore.UTC().Format(time.RFC3339), duration.HumanDuration(l.NotBefore.Sub(now)))
	}
	warn, fail := WarnBefore, ErrorBefore
	if l.Foreign {
		warn, fail = ErrorBefore, 0
	}
	if l.RenewAt > 0 && l.NotBefore.IsZero() {
		// The lifetime is unknown: only expiry can be judged.
		return OK, fmt.Sprintf("%s expires in %s (%s)", l.What, duration.HumanDuration(left), l.NotAfter.UTC().Format(time.RFC3339))
	}
	if l.RenewAt > 0 {
		life := l.NotAfter.Sub(l.NotBefore)
		q := 1 - l.RenewAt
		warn = min(warn, time.Duration(float64(life)*q*0.75))
		fail = min(fail, time.Duration(float64(life)*q*0.3))
	}
	msg := fmt.Sprintf("%s expires in %s (%s)", l.What, duration.HumanDuration(left), l.NotAfter.UTC().Format(time.RFC3339))
	switch {
	case left < fail:
		if l.RenewAt > 0 {
			msg += ": it should have been renewed long ago"
		}
		return Error, msg
	case left < warn:
		if l.RenewAt > 0 {
			msg += ": its renewal is overdue"
		}
		return Warning, msg
	}
	return OK, msg
}
