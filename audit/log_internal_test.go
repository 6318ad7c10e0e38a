package audit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRecordFailsAfterWriteError checks that a failed write, which may have
// left a torn line, stops the Log for good.
func TestRecordFailsAfterWriteError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(Config{Path: path})
	require.NoError(t, err)
	e := Event{Type: TokenUse, Result: ResultSuccess}
	require.NoError(t, l.Record(e))

	writable := l.f
	readOnly, err := os.Open(path)
	require.NoError(t, err)
	l.f = readOnly
	require.Error(t, l.Record(e))
	l.f = writable
	require.NoError(t, readOnly.Close())

	err = l.Record(e)
	require.ErrorContains(t, err, "log unusable after a failed write")
	seq, _ := l.Head()
	assert.Equal(t, uint64(1), seq)
	require.NoError(t, l.Close())
}
