package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The audit logs of three replicas are verified together, each as its own
// chain; a broken chain and a copy of a chain fail the command, and the
// others are still reported.
func TestAuditVerifySeveralReplicas(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, records int) string {
		path := filepath.Join(dir, name)
		l, err := audit.Open(audit.Config{Path: path, Sync: true})
		require.NoError(t, err)
		for i := range records {
			require.NoError(t, l.Record(audit.Event{Type: audit.CertIssue, Result: audit.ResultSuccess, Cluster: fmt.Sprintf("c%d", i)}))
		}
		require.NoError(t, l.Close())
		return path
	}
	a, b, c := write("replica-0.log", 3), write("replica-1.log", 5), write("replica-2.log", 2)
	verify := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"audit", "verify"}, args...), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	code, out := verify(a, b, c)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "3 of 3 chains verified, each on its own")
	assert.Contains(t, out, ": 10 records")

	// One replica's log edited: that chain fails, the others are reported.
	raw, err := os.ReadFile(b)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(b, []byte(strings.Replace(string(raw), `"c2"`, `"c9"`, 1)), 0o600))
	code, out = verify(a, b, c)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "2 of 3 chains verified")
	assert.Contains(t, out, "replica-1.log")

	// The same chain twice is not two replicas.
	code, out = verify(a, c, a)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "the same chain as")

	code, _ = verify()
	assert.NotEqual(t, 0, code, "no file")
}
