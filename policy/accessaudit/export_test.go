package accessaudit

import (
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/stretchr/testify/require"
)

// testAdmission is the default rule set's engine, built once for the
// package's tests (the server's rules, as every view applies them).
var testAdmission = sync.OnceValues(func() (*admission.Engine, error) {
	return admission.New(admission.Config{Recorder: audit.Discard})
})

// ConfigForTest is a Config for the server namespace adminNS with the
// default admission rules.
func ConfigForTest(tb testing.TB, adminNS string) Config {
	tb.Helper()
	e, err := testAdmission()
	require.NoError(tb, err)
	return Config{AdminNamespace: adminNS, Admission: e}
}
