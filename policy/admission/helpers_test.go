package admission_test

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/stretchr/testify/require"
)

// recorder keeps the events it is given, after the checks a real log makes.
type recorder struct {
	mu     sync.Mutex
	events []audit.Event
	fail   error
}

func (r *recorder) Record(e audit.Event) error {
	if err := audit.Discard.Record(e); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	e.Details = maps.Clone(e.Details)
	r.events = append(r.events, e)
	return nil
}

func (r *recorder) last(t *testing.T) audit.Event {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.events)
	return r.events[len(r.events)-1]
}

func (r *recorder) setFail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = err
}

var errDiskFull = errors.New("disk full")

// newEngine returns an engine with the default rules, recording into a
// fresh recorder; edit changes the config first.
func newEngine(t testing.TB, edit func(*admission.Config)) (*admission.Engine, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg := admission.Config{Recorder: rec}
	if edit != nil {
		edit(&cfg)
	}
	e, err := admission.New(cfg)
	require.NoError(t, err)
	return e, rec
}

// ruleSet is a user rule set with one file: a deny rule in package
// relaymesh.admission.<pkg> that refuses objects whose spec.<field> is
// true, and a test of it.
func ruleSet(name, pkg, field string) admission.RuleSet {
	return admission.RuleSet{Name: name, Version: "1", Files: map[string]string{"rules.rego": fmt.Sprintf(`package relaymesh.admission.%[1]s

deny contains msg if {
	input.object.spec.%[2]s == true
	msg := sprintf("%%s/%%s sets %[2]s", [input.namespace, input.name])
}

test_denied if {
	count(deny) == 1 with input as {"namespace": "a", "name": "b", "object": {"spec": {"%[2]s": true}}}
}

test_allowed if {
	count(deny) == 0 with input as {"object": {"spec": {}}}
}
`, pkg, field)}}
}

// single is a rule set of one file.
func single(name, src string) admission.RuleSet {
	return admission.RuleSet{Name: name, Version: "1", Files: map[string]string{"rules.rego": src}}
}

// request is a CREATE of kind in namespace "team-a" with the given spec.
func request(kind string, spec map[string]any) admission.Request {
	return admission.Request{
		Operation: admission.OperationCreate, Kind: kind, Namespace: "team-a", Name: "obj",
		Object: map[string]any{
			"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": kind,
			"metadata": map[string]any{"name": "obj", "namespace": "team-a"},
			"spec":     spec,
		},
		User: admission.User{Username: "alice", Groups: []string{"team-a", "system:authenticated"}},
	}
}

// statusOf returns the status of the named rule set.
func statusOf(t *testing.T, all []admission.RuleSetStatus, name string) admission.RuleSetStatus {
	t.Helper()
	for _, s := range all {
		if s.Name == name {
			return s
		}
	}
	require.Failf(t, "no status", "rule set %s has no status in %+v", name, all)
	return admission.RuleSetStatus{}
}

func (r *recorder) all() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.events...)
}

// fromAPIServer is req as it arrives over TLS from the kube-apiserver: with
// its verified client certificate.
func fromAPIServer(req *http.Request) *http.Request {
	req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: "kube-apiserver"}}}}}
	return req
}
