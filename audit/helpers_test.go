package audit_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/audit"
)

// t0 is the time of the first record written with stepClock.
var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// stepClock returns a clock that reads t0, then one second later per call.
func stepClock() func() time.Time {
	var calls atomic.Int64
	return func() time.Time {
		return t0.Add(time.Duration(calls.Add(1)-1) * time.Second)
	}
}

// event returns the i-th test event; its cluster is "cluster-<i>".
func event(i int) audit.Event {
	return audit.Event{
		Type:    audit.CertIssue,
		Result:  audit.ResultSuccess,
		Cluster: fmt.Sprintf("cluster-%d", i),
		Subject: fmt.Sprintf("spiffe://relay.example/cluster/cluster-%d/agent", i),
		Serial:  fmt.Sprintf("%032x", i),
		Peer:    "10.0.0.1:50443",
		Details: map[string]string{"ttl": "24h", "renewal": "false"},
	}
}

// writeLog writes a log of n test events with stepClock and returns its path.
func writeLog(t testing.TB, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path, Clock: stepClock()})
	require.NoError(t, err)
	for i := 1; i <= n; i++ {
		require.NoError(t, l.Record(event(i)))
	}
	require.NoError(t, l.Close())
	return path
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// splitLines returns the lines of data without their "\n"; data must end
// in "\n".
func splitLines(t testing.TB, data []byte) [][]byte {
	t.Helper()
	require.True(t, bytes.HasSuffix(data, []byte("\n")))
	return bytes.Split(data[:len(data)-1], []byte("\n"))
}

// joinLines is the inverse of splitLines.
func joinLines(lines [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// decode parses one line.
func decode(t testing.TB, line []byte) audit.Record {
	t.Helper()
	var r audit.Record
	require.NoError(t, json.Unmarshal(line, &r))
	return r
}

// forge encodes r with a hash computed from the format's rules, written out
// independently of the package: hex SHA-256 of prev followed by the line
// with an empty hash.
func forge(t testing.TB, r audit.Record) []byte {
	t.Helper()
	r.Hash = ""
	blank, err := json.Marshal(r)
	require.NoError(t, err)
	sum := sha256.Sum256(append([]byte(r.Prev), blank...))
	r.Hash = hex.EncodeToString(sum[:])
	line, err := json.Marshal(r)
	require.NoError(t, err)
	return line
}
