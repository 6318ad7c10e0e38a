package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// EventType names what happened, as "object.action".
type EventType string

// The event types Relaymesh records.
const (
	// TokenMint: a bootstrap token was created for a cluster.
	TokenMint EventType = "token.mint"
	// TokenUse: an agent presented a bootstrap token and it was accepted.
	TokenUse EventType = "token.use"
	// TokenFailure: a presented bootstrap token was refused.
	TokenFailure EventType = "token.failure"
	// CertIssue: a certificate was issued.
	CertIssue EventType = "cert.issue"
	// CertRenew: a certificate was renewed.
	CertRenew EventType = "cert.renew"
	// CertDeny: a certificate request was refused.
	CertDeny EventType = "cert.deny"
	// ClusterRegister: a cluster joined the mesh.
	ClusterRegister EventType = "cluster.register"
	// ClusterRevoke: a cluster's credentials were revoked.
	ClusterRevoke EventType = "cluster.revoke"
	// AdmissionDecision: the admission webhook allowed or denied an object.
	AdmissionDecision EventType = "admission.decision"
	// RotationStep: the CA rotation state machine took a step.
	RotationStep EventType = "rotation.step"
	// TrustBundleAccept: a foreign SPIFFE trust bundle was fetched and
	// accepted (Subject: the trust domain; Details: sequence, roots).
	TrustBundleAccept EventType = "trust.bundle.accept"
	// TrustBundleRefuse: a fetched foreign trust bundle, or the answer of
	// its endpoint, was refused; the last accepted one is kept.
	TrustBundleRefuse EventType = "trust.bundle.refuse"
	// Throttled: calls refused by a rate limit over a window, summarised in
	// one record (how many, from how many peers, for what) instead of one
	// record per call, so a flood cannot fill the log.
	Throttled EventType = "throttled"
)

// Event results.
const (
	ResultSuccess = "success"
	ResultFailure = "failure"
)

// Limits on one event. Together with maxLineLen they keep every line small
// enough for Verify to read.
const (
	maxFieldLen = 1 << 10 // bytes in any one string, Details keys and values included
	maxDetails  = 32      // entries in Details
)

// ErrInvalidEvent is wrapped by the error Record returns for an event it
// refuses to write.
var ErrInvalidEvent = errors.New("audit: invalid event")

// Event is what happened, as the caller reports it. Record adds the
// sequence number, time and chain.
type Event struct {
	// Type is required.
	Type EventType `json:"type"`
	// Result is required: ResultSuccess or ResultFailure.
	Result string `json:"result"`
	// Cluster is the cluster the event is about, if any.
	Cluster string `json:"cluster,omitempty"`
	// Subject is who or what acted or was acted on, e.g. a SPIFFE ID.
	Subject string `json:"subject,omitempty"`
	// Serial is a certificate serial number, in hex.
	Serial string `json:"serial,omitempty"`
	// Peer is the remote address.
	Peer string `json:"peer,omitempty"`
	// Reason says why something failed. It MUST NOT contain a secret.
	Reason string `json:"reason,omitempty"`
	// Details are a few more facts. They MUST NOT contain secrets.
	Details map[string]string `json:"details,omitempty"`
}

// Recorder is the interface the rest of Relaymesh depends on to write audit
// events; *Log and Discard implement it.
//
// Record MUST be safe for concurrent use. It MUST return only once the event
// is written (or, for Discard, dropped), or else return an error, and MUST
// NOT keep e or its Details map after it returns. It MUST refuse an invalid
// event with an error wrapping ErrInvalidEvent.
//
// Callers MUST NOT put secrets in an event and SHOULD NOT complete the
// action being recorded (hand out a token or certificate) when Record fails.
type Recorder interface {
	Record(e Event) error
}

// Discard is a Recorder that drops every event. It still refuses invalid
// events, as a Log would, so that tests using it catch events that
// production would reject.
//
// Discard is for tests and for a server whose operator explicitly opted out
// of auditing: the server refuses to start without an audit log otherwise.
var Discard Recorder = discard{}

type discard struct{}

func (discard) Record(e Event) error { return e.check() }

// check returns an error wrapping ErrInvalidEvent if e may not be recorded.
func (e Event) check() error {
	if problems := e.problems(); len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidEvent, strings.Join(problems, "; "))
	}
	if n := e.longestLine(); n > maxLineLen {
		return fmt.Errorf("%w: record would be %d bytes, at most %d", ErrInvalidEvent, n, maxLineLen)
	}
	return nil
}

// longestLine bounds the length of a line holding e, whatever its seq and
// time, so that whether e fits does not depend on when it is recorded. It
// encodes e only when a quick bound is not enough: encoding/json writes at
// most six bytes ("\u003c") for each byte of a valid string.
func (e Event) longestLine() int {
	const envelope = 1 << 10 // field names, seq, time, prev and hash take less
	n := len(e.Type) + len(e.Result) + len(e.Cluster) + len(e.Subject) + len(e.Serial) + len(e.Peer) + len(e.Reason)
	for k, v := range e.Details {
		n += len(k) + len(v) + len(`"":"",`)
	}
	if envelope+6*n <= maxLineLen {
		return envelope + 6*n
	}
	line, err := json.Marshal(Record{Seq: math.MaxUint64, Time: lastTime, Event: e, Prev: genesis, Hash: genesis})
	if err != nil {
		return math.MaxInt
	}
	return len(line)
}

// lastTime is the latest time a record can hold, and the longest to encode.
var lastTime = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)

// problems lists everything wrong with e. Messages name fields and sizes,
// never values, since a rejected value may be one that should not be logged.
func (e Event) problems() []string {
	var out []string
	add := func(field, problem string) {
		if problem != "" {
			out = append(out, field+": "+problem)
		}
	}
	add("type", checkString(string(e.Type), true))
	if p := checkString(e.Result, true); p != "" {
		add("result", p)
	} else if e.Result != ResultSuccess && e.Result != ResultFailure {
		add("result", fmt.Sprintf("must be %q or %q", ResultSuccess, ResultFailure))
	}
	add("cluster", checkString(e.Cluster, false))
	add("subject", checkString(e.Subject, false))
	add("serial", checkString(e.Serial, false))
	add("peer", checkString(e.Peer, false))
	add("reason", checkString(e.Reason, false))
	if len(e.Details) > maxDetails {
		add("details", fmt.Sprintf("%d entries, at most %d", len(e.Details), maxDetails))
	}
	keys := make([]string, 0, len(e.Details))
	for k := range e.Details {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if p := checkString(k, true); p != "" {
			add("details", "key "+p)
			continue
		}
		add(fmt.Sprintf("details[%q]", k), checkString(e.Details[k], false))
	}
	return out
}

// checkString says what is wrong with one string field, or "".
func checkString(s string, required bool) string {
	switch {
	case s == "" && required:
		return "required"
	case len(s) > maxFieldLen:
		return fmt.Sprintf("%d bytes, at most %d", len(s), maxFieldLen)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.ContainsFunc(s, isLineBreakOrControl):
		return "contains a newline or other control character"
	}
	return ""
}

// isLineBreakOrControl reports runes that could split or disguise a line
// when the log is read as text: C0 and C1 controls (CR, LF, tab, ESC…) and
// the Unicode line and paragraph separators.
func isLineBreakOrControl(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029'
}
