package audit_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/audit"
)

var _ audit.Recorder = (*audit.Log)(nil)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     audit.Config
		wantErr string
	}{
		{name: "path only", cfg: audit.Config{Path: "audit.log"}},
		{name: "everything", cfg: audit.Config{Path: "audit.log", Clock: time.Now, Sync: true}},
		{name: "no path", cfg: audit.Config{}, wantErr: "path: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			_, err = audit.Open(tt.cfg)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestFormat pins the line format against a hash computed by hand from the
// rules in the package documentation.
func TestFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path, Clock: func() time.Time { return t0 }})
	require.NoError(t, err)
	require.NoError(t, l.Record(audit.Event{
		Type:    audit.TokenMint,
		Result:  audit.ResultSuccess,
		Cluster: "east",
		Details: map[string]string{"b": "2", "a": "1"},
	}))
	require.NoError(t, l.Close())

	prev := strings.Repeat("0", 64)
	blank := `{"seq":1,"time":"2026-11-22T10:00:00Z","type":"token.mint","result":"success",` +
		`"cluster":"east","details":{"a":"1","b":"2"},"prev":"` + prev + `","hash":""}`
	sum := sha256.Sum256([]byte(prev + blank))
	want := strings.TrimSuffix(blank, `""}`) + `"` + hex.EncodeToString(sum[:]) + `"}` + "\n"
	assert.Equal(t, want, string(readFile(t, path)))
}

func TestRecordAndVerify(t *testing.T) {
	tests := []struct {
		name string
		n    int
	}{
		{name: "one record", n: 1},
		{name: "ten records", n: 10},
		{name: "a thousand records", n: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			l, err := audit.Open(audit.Config{Path: path, Clock: stepClock()})
			require.NoError(t, err)
			for i := 1; i <= tt.n; i++ {
				require.NoError(t, l.Record(event(i)))
			}
			seq, head := l.Head()
			require.NoError(t, l.Close())

			data := readFile(t, path)
			s, err := audit.Verify(bytes.NewReader(data))
			require.NoError(t, err)
			assert.Equal(t, audit.Summary{
				Records:  uint64(tt.n),
				HeadHash: head,
				First:    t0,
				Last:     t0.Add(time.Duration(tt.n-1) * time.Second),
			}, s)
			assert.Equal(t, uint64(tt.n), seq)

			lines := splitLines(t, data)
			require.Len(t, lines, tt.n)
			prev := strings.Repeat("0", 64)
			for i, line := range lines {
				r := decode(t, line)
				assert.Equal(t, uint64(i+1), r.Seq)
				assert.Equal(t, event(i+1), r.Event)
				assert.Equal(t, prev, r.Prev)
				assert.Equal(t, string(forge(t, r)), string(line), "line %d", i+1)
				prev = r.Hash
			}
		})
	}
}

func TestVerifyEmpty(t *testing.T) {
	s, err := audit.Verify(strings.NewReader(""))
	require.NoError(t, err)
	assert.Equal(t, audit.Summary{}, s)

	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path})
	require.NoError(t, err)
	seq, head := l.Head()
	assert.Zero(t, seq)
	assert.Empty(t, head)
	require.NoError(t, l.Close())
}

func TestReopenContinuesChain(t *testing.T) {
	path := writeLog(t, 3)
	before, err := audit.Verify(bytes.NewReader(readFile(t, path)))
	require.NoError(t, err)

	clock := func() time.Time { return t0.Add(time.Hour) }
	l, err := audit.Open(audit.Config{Path: path, Clock: clock})
	require.NoError(t, err)
	seq, head := l.Head()
	assert.Equal(t, uint64(3), seq)
	assert.Equal(t, before.HeadHash, head)
	require.NoError(t, l.Record(event(4)))
	require.NoError(t, l.Record(event(5)))
	seq, head = l.Head()
	require.NoError(t, l.Close())

	data := readFile(t, path)
	s, err := audit.Verify(bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, audit.Summary{Records: 5, HeadHash: head, First: t0, Last: t0.Add(time.Hour)}, s)
	assert.Equal(t, uint64(5), seq)
	lines := splitLines(t, data)
	assert.Equal(t, before.HeadHash, decode(t, lines[3]).Prev)
	assert.Equal(t, uint64(4), decode(t, lines[3]).Seq)
}

func TestOpenRefusesBrokenLog(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(data []byte) []byte
		wantErr string
	}{
		{
			name:    "edited line",
			damage:  func(data []byte) []byte { return bytes.Replace(data, []byte("cluster-3"), []byte("cluster-9"), 1) },
			wantErr: "line 3: hash mismatch (record edited)",
		},
		{
			name:    "torn last line",
			damage:  func(data []byte) []byte { return data[:len(data)-20] },
			wantErr: "line 5: last line has no newline (torn write after a crash",
		},
		{
			name:    "garbage appended",
			damage:  func(data []byte) []byte { return append(data, "garbage\n"...) },
			wantErr: "line 6: not a record",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeLog(t, 5)
			damaged := tt.damage(readFile(t, path))
			require.NoError(t, os.WriteFile(path, damaged, 0o600))

			l, err := audit.Open(audit.Config{Path: path})
			require.ErrorIs(t, err, audit.ErrTampered)
			require.ErrorContains(t, err, "refusing to append to a broken log: "+tt.wantErr)
			assert.Nil(t, l)
			assert.Equal(t, damaged, readFile(t, path), "Open must not change a broken log")
		})
	}
}

func TestOpenRefusesUnsafeFile(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T) string
		wantErr string
	}{
		{
			name: "group-writable",
			setup: func(t *testing.T) string {
				path := writeLog(t, 1)
				require.NoError(t, os.Chmod(path, 0o620))
				return path
			},
			wantErr: "lets group or others write it",
		},
		{
			name: "world-writable",
			setup: func(t *testing.T) string {
				path := writeLog(t, 1)
				require.NoError(t, os.Chmod(path, 0o666))
				return path
			},
			wantErr: "lets group or others write it",
		},
		{
			name:    "directory",
			setup:   func(t *testing.T) string { return t.TempDir() },
			wantErr: "audit:",
		},
		{
			name:    "missing parent directory",
			setup:   func(t *testing.T) string { return filepath.Join(t.TempDir(), "no", "audit.log") },
			wantErr: "no such file or directory",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := audit.Open(audit.Config{Path: tt.setup(t)})
			require.ErrorContains(t, err, tt.wantErr)
			assert.Nil(t, l)
		})
	}
}

func TestFileMode(t *testing.T) {
	for _, sync := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "audit.log")
		l, err := audit.Open(audit.Config{Path: path, Sync: sync})
		require.NoError(t, err)
		require.NoError(t, l.Record(event(1)))
		require.NoError(t, l.Close())
		info, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "sync=%v", sync)
	}
}

func TestRecordRejectsInvalidEvents(t *testing.T) {
	tooManyDetails := map[string]string{}
	for i := range 33 {
		tooManyDetails[strings.Repeat("k", i+1)] = "v"
	}
	// Within every per-field limit, but '<' is escaped to six bytes, so the
	// line would exceed 64 KiB.
	hugeDetails := map[string]string{}
	for i := range 32 {
		hugeDetails[strings.Repeat("k", i+1)] = strings.Repeat("<", 1024)
	}
	ok := audit.Event{Type: audit.TokenUse, Result: audit.ResultFailure}
	with := func(change func(e *audit.Event)) audit.Event {
		e := ok
		change(&e)
		return e
	}
	tests := []struct {
		name    string
		event   audit.Event
		wantErr string
	}{
		{name: "empty type", event: with(func(e *audit.Event) { e.Type = "" }), wantErr: "type: required"},
		{name: "empty result", event: with(func(e *audit.Event) { e.Result = "" }), wantErr: "result: required"},
		{name: "unknown result", event: with(func(e *audit.Event) { e.Result = "denied" }), wantErr: `result: must be "success" or "failure"`},
		{name: "newline in reason", event: with(func(e *audit.Event) { e.Reason = "bad token s3cr3t\nforged line" }), wantErr: "reason: contains a newline"},
		{name: "carriage return in subject", event: with(func(e *audit.Event) { e.Subject = "spiffe://x\r" }), wantErr: "subject: contains a newline"},
		{name: "newline in type", event: with(func(e *audit.Event) { e.Type = "token.use\n" }), wantErr: "type: contains a newline"},
		{name: "line separator in peer", event: with(func(e *audit.Event) { e.Peer = "a\u2028b" }), wantErr: "peer: contains a newline"},
		{name: "escape in cluster", event: with(func(e *audit.Event) { e.Cluster = "\x1b[2Jeast" }), wantErr: "cluster: contains a newline or other control character"},
		{name: "newline in details value", event: with(func(e *audit.Event) { e.Details = map[string]string{"k": "a\nb"} }), wantErr: `details["k"]: contains a newline`},
		{name: "newline in details key", event: with(func(e *audit.Event) { e.Details = map[string]string{"k\n": "v"} }), wantErr: "details: key contains a newline"},
		{name: "empty details key", event: with(func(e *audit.Event) { e.Details = map[string]string{"": "v"} }), wantErr: "details: key required"},
		{name: "invalid UTF-8", event: with(func(e *audit.Event) { e.Serial = "\xff\xfe" }), wantErr: "serial: not valid UTF-8"},
		{name: "oversized field", event: with(func(e *audit.Event) { e.Reason = strings.Repeat("x", 1025) }), wantErr: "reason: 1025 bytes, at most 1024"},
		{name: "oversized details value", event: with(func(e *audit.Event) { e.Details = map[string]string{"k": strings.Repeat("x", 1025)} }), wantErr: `details["k"]: 1025 bytes`},
		{name: "oversized details key", event: with(func(e *audit.Event) { e.Details = map[string]string{strings.Repeat("k", 1025): "v"} }), wantErr: "details: key 1025 bytes"},
		{name: "too many details", event: with(func(e *audit.Event) { e.Details = tooManyDetails }), wantErr: "details: 33 entries, at most 32"},
		{name: "record too long", event: with(func(e *audit.Event) { e.Details = hugeDetails }), wantErr: "at most 65536"},
		{
			name:    "every problem at once",
			event:   audit.Event{Result: "maybe", Peer: "\n"},
			wantErr: `type: required; result: must be "success" or "failure"; peer: contains a newline`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeLog(t, 2)
			before := readFile(t, path)
			l, err := audit.Open(audit.Config{Path: path, Clock: stepClock()})
			require.NoError(t, err)
			defer l.Close()
			seq, head := l.Head()

			err = l.Record(tt.event)
			require.ErrorIs(t, err, audit.ErrInvalidEvent)
			require.ErrorContains(t, err, tt.wantErr)
			assert.NotContains(t, err.Error(), "s3cr3t", "errors must not echo values")
			require.ErrorIs(t, audit.Discard.Record(tt.event), audit.ErrInvalidEvent)

			assert.Equal(t, before, readFile(t, path), "nothing may be written")
			gotSeq, gotHead := l.Head()
			assert.Equal(t, seq, gotSeq)
			assert.Equal(t, head, gotHead)

			// The log is still usable.
			require.NoError(t, l.Record(ok))
			require.NoError(t, l.Close())
			s, err := audit.Verify(bytes.NewReader(readFile(t, path)))
			require.NoError(t, err)
			assert.Equal(t, uint64(3), s.Records)
		})
	}
}

func TestRecordAcceptsLimits(t *testing.T) {
	maxDetails := map[string]string{}
	for i := range 32 {
		maxDetails[strings.Repeat("k", i+1)] = strings.Repeat("v", 1024)
	}
	tests := []struct {
		name  string
		event audit.Event
	}{
		{name: "minimal", event: audit.Event{Type: audit.RotationStep, Result: audit.ResultSuccess}},
		{name: "new event type", event: audit.Event{Type: "ca.something-new", Result: audit.ResultFailure}},
		{name: "1 KiB fields", event: audit.Event{
			Type: audit.CertDeny, Result: audit.ResultFailure,
			Cluster: strings.Repeat("c", 1024), Subject: strings.Repeat("s", 1024), Serial: strings.Repeat("f", 1024),
			Peer: strings.Repeat("p", 1024), Reason: strings.Repeat("r", 1024),
		}},
		{name: "32 details of 1 KiB", event: audit.Event{Type: audit.AdmissionDecision, Result: audit.ResultSuccess, Details: maxDetails}},
		{name: "empty details map", event: audit.Event{Type: audit.ClusterRegister, Result: audit.ResultSuccess, Details: map[string]string{}}},
		{name: "empty details value", event: audit.Event{Type: audit.ClusterRevoke, Result: audit.ResultSuccess, Details: map[string]string{"by": ""}}},
		{name: "non-ASCII and HTML", event: audit.Event{Type: audit.TokenFailure, Result: audit.ResultFailure, Reason: `<b>"ünïcode" & 日本 🙂\</b>`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			l, err := audit.Open(audit.Config{Path: path, Clock: stepClock()})
			require.NoError(t, err)
			require.NoError(t, l.Record(tt.event))
			require.NoError(t, audit.Discard.Record(tt.event))
			require.NoError(t, l.Close())
			_, err = audit.Verify(bytes.NewReader(readFile(t, path)))
			require.NoError(t, err)
		})
	}
}

// TestRoundTrip checks that decoding a line strictly and encoding it again
// reproduces it byte for byte, which is what lets Verify recompute hashes
// from decoded records.
func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		clock time.Time
		event audit.Event
	}{
		{name: "whole seconds", clock: t0, event: event(1)},
		{name: "nanoseconds", clock: t0.Add(123456789), event: event(2)},
		{name: "trailing zeros in fraction", clock: t0.Add(120 * time.Millisecond), event: event(3)},
		{name: "non-UTC clock", clock: t0.In(time.FixedZone("CEST", 2*60*60)), event: event(4)},
		{name: "local clock with monotonic reading", clock: time.Now(), event: event(5)},
		{name: "escaped characters", clock: t0, event: audit.Event{
			Type: audit.CertDeny, Result: audit.ResultFailure,
			Reason:  `<script>alert("x")</script> & \ ünïcode 日本 🙂`,
			Details: map[string]string{"z": "last", "a": "first", "<&>": "html", "ü": "ü"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			l, err := audit.Open(audit.Config{Path: path, Clock: func() time.Time { return tt.clock }})
			require.NoError(t, err)
			require.NoError(t, l.Record(tt.event))
			require.NoError(t, l.Close())
			line := splitLines(t, readFile(t, path))[0]

			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			var r audit.Record
			require.NoError(t, dec.Decode(&r))
			again, err := json.Marshal(r)
			require.NoError(t, err)
			assert.Equal(t, string(line), string(again))
			assert.Equal(t, time.UTC, r.Time.Location())
			assert.True(t, r.Time.Equal(tt.clock))
			assert.Equal(t, tt.event, r.Event)
			assert.Equal(t, string(line), string(forge(t, r)), "hash recomputes from the decoded record")
		})
	}
}

func TestConcurrentRecord(t *testing.T) {
	const goroutines, each = 8, 200
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path, Clock: stepClock()})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, l.Record(event(g*each+i)))
				l.Head()
			}
		})
	}
	wg.Wait()
	seq, head := l.Head()
	require.NoError(t, l.Close())

	s, err := audit.Verify(bytes.NewReader(readFile(t, path)))
	require.NoError(t, err)
	assert.Equal(t, uint64(goroutines*each), s.Records)
	assert.Equal(t, uint64(goroutines*each), seq)
	assert.Equal(t, head, s.HeadHash)
}

func TestClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path})
	require.NoError(t, err)
	require.NoError(t, l.Record(event(1)))
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "a second Close does nothing")

	err = l.Record(event(2))
	require.ErrorIs(t, err, os.ErrClosed)
	seq, _ := l.Head()
	assert.Equal(t, uint64(1), seq)
	s, err := audit.Verify(bytes.NewReader(readFile(t, path)))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), s.Records)
}

func TestDiscard(t *testing.T) {
	require.NoError(t, audit.Discard.Record(event(1)))
	require.ErrorIs(t, audit.Discard.Record(audit.Event{}), audit.ErrInvalidEvent)
}

func BenchmarkRecord(b *testing.B) {
	l, err := audit.Open(audit.Config{Path: filepath.Join(b.TempDir(), "audit.log")})
	require.NoError(b, err)
	b.Cleanup(func() { l.Close() })
	e := event(1)
	n := 0
	for b.Loop() {
		if err := l.Record(e); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
}
