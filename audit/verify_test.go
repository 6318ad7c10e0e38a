package audit_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/audit"
)

func TestVerifyDetectsTampering(t *testing.T) {
	const n = 10
	path := writeLog(t, n)
	original := readFile(t, path)

	// Each case gets its own copy of the ten lines of the log.
	tests := []struct {
		name     string
		tamper   func(t *testing.T, lines [][]byte) []byte
		wantLine string
	}{
		{
			name: "edit one field of a middle line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[4] = bytes.Replace(lines[4], []byte(`"cluster":"cluster-5"`), []byte(`"cluster":"cluster-X"`), 1)
				return joinLines(lines)
			},
			wantLine: "line 5: hash mismatch (record edited)",
		},
		{
			name: "edit the time of the last line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[9] = bytes.Replace(lines[9], []byte("10:00:09Z"), []byte("10:00:08Z"), 1)
				return joinLines(lines)
			},
			wantLine: "line 10: hash mismatch (record edited)",
		},
		{
			name: "delete a middle line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				return joinLines(append(lines[:3:3], lines[4:]...))
			},
			wantLine: "line 4: seq 5 follows 3 (record deleted or reordered)",
		},
		{
			name:     "delete the first line",
			tamper:   func(t *testing.T, lines [][]byte) []byte { return joinLines(lines[1:]) },
			wantLine: "line 1: seq 2, want 1 (records deleted from the start)",
		},
		{
			name: "swap two lines",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2], lines[3] = lines[3], lines[2]
				return joinLines(lines)
			},
			wantLine: "line 3: seq 4 follows 2 (record deleted or reordered)",
		},
		{
			name: "duplicate a line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				return joinLines(append(lines[:4:4], lines[3:]...))
			},
			wantLine: "line 5: seq 4 follows 4 (record inserted or reordered)",
		},
		{
			name: "insert a forged line with its own valid hash",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				forged := forge(t, audit.Record{
					Seq: 4, Time: t0.Add(3 * time.Second), Event: event(99), Prev: decode(t, lines[2]).Hash,
				})
				return joinLines(append(lines[:3:3], append([][]byte{forged}, lines[3:]...)...))
			},
			wantLine: "line 5: seq 4 follows 4 (record inserted or reordered)",
		},
		{
			name: "replace a line with a forged one",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[3] = forge(t, audit.Record{
					Seq: 4, Time: t0.Add(3 * time.Second), Event: event(99), Prev: decode(t, lines[2]).Hash,
				})
				return joinLines(lines)
			},
			wantLine: "line 5: prev does not match line 4's hash",
		},
		{
			name: "forged line linked to the wrong predecessor",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				r := decode(t, lines[3])
				r.Prev = decode(t, lines[1]).Hash
				lines[3] = forge(t, r)
				return joinLines(lines)
			},
			wantLine: "line 4: prev does not match line 3's hash",
		},
		{
			name: "forged first line with a non-zero prev",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				r := decode(t, lines[0])
				r.Prev = strings.Repeat("1", 64)
				lines[0] = forge(t, r)
				return joinLines(lines)
			},
			wantLine: "line 1: prev is not 64 zeros",
		},
		{
			name: "forged line with a time not in UTC",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				r := decode(t, lines[9])
				r.Time = r.Time.In(time.FixedZone("", 3600))
				lines[9] = forge(t, r)
				return joinLines(lines)
			},
			wantLine: "line 10: time is not in UTC",
		},
		{
			name: "forged line with an invalid event",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				r := decode(t, lines[9])
				r.Result = "maybe"
				lines[9] = forge(t, r)
				return joinLines(lines)
			},
			wantLine: `line 10: invalid event: result: must be "success" or "failure"`,
		},
		{
			name: "truncated last line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				data := joinLines(lines)
				return data[:len(data)-30]
			},
			wantLine: "line 10: last line has no newline (torn write after a crash, or truncated)",
		},
		{
			name: "missing final newline",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				data := joinLines(lines)
				return data[:len(data)-1]
			},
			wantLine: "line 10: last line has no newline",
		},
		{
			name: "garbage line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = []byte("this is not json")
				return joinLines(lines)
			},
			wantLine: "line 3: not a record: invalid character",
		},
		{
			name: "empty line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = nil
				return joinLines(lines)
			},
			wantLine: "line 3: empty line",
		},
		{
			name: "unknown field",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = bytes.Replace(lines[2], []byte(`"prev":`), []byte(`"admin":"yes","prev":`), 1)
				return joinLines(lines)
			},
			wantLine: `line 3: not a record: json: unknown field "admin"`,
		},
		{
			name: "second object on a line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = append(lines[2], `{"seq":1}`...)
				return joinLines(lines)
			},
			wantLine: "line 3: data after the record",
		},
		{
			name: "extra space",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = bytes.Replace(lines[2], []byte(`{"seq"`), []byte(`{ "seq"`), 1)
				return joinLines(lines)
			},
			wantLine: "line 3: not in canonical form (record edited)",
		},
		{
			name: "duplicate key, the second one wins when decoding",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = bytes.Replace(lines[2], []byte(`"result":"success"`), []byte(`"result":"failure","result":"success"`), 1)
				return joinLines(lines)
			},
			wantLine: "line 3: not in canonical form (record edited)",
		},
		{
			name: "differently escaped string",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = bytes.Replace(lines[2], []byte(`"cluster":"cluster-3"`), []byte(`"cluster":"\u0063luster-3"`), 1)
				return joinLines(lines)
			},
			wantLine: "line 3: not in canonical form (record edited)",
		},
		{
			name: "key in another case",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = bytes.Replace(lines[2], []byte(`"peer":`), []byte(`"PEER":`), 1)
				return joinLines(lines)
			},
			wantLine: "line 3: not in canonical form (record edited)",
		},
		{
			name: "CRLF line endings",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				return bytes.ReplaceAll(joinLines(lines), []byte("\n"), []byte("\r\n"))
			},
			wantLine: "line 1: not in canonical form (record edited)",
		},
		{
			name: "over-long line",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				lines[2] = bytes.Repeat([]byte("a"), 65537)
				return joinLines(lines)
			},
			wantLine: "line 3: longer than 65536 bytes",
		},
		{
			name: "over-long last line without newline",
			tamper: func(t *testing.T, lines [][]byte) []byte {
				return append(joinLines(lines), bytes.Repeat([]byte("a"), 1<<20)...)
			},
			wantLine: "line 11: longer than 65536 bytes",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := splitLines(t, bytes.Clone(original))
			data := tt.tamper(t, lines)
			s, err := audit.Verify(bytes.NewReader(data))
			require.ErrorIs(t, err, audit.ErrTampered)
			assert.True(t, strings.HasPrefix(err.Error(), "audit: "+tt.wantLine), "error %q", err)
			assert.Equal(t, audit.Summary{}, s)
		})
	}
}

// TestVerifyTailTruncation shows the documented limitation: a log cut after
// a complete line verifies, and only a head recorded elsewhere reveals it.
func TestVerifyTailTruncation(t *testing.T) {
	path := writeLog(t, 5)
	data := readFile(t, path)
	full, err := audit.Verify(bytes.NewReader(data))
	require.NoError(t, err)

	lines := splitLines(t, data)
	cut, err := audit.Verify(bytes.NewReader(joinLines(lines[:4])))
	require.NoError(t, err)
	assert.Equal(t, uint64(4), cut.Records)
	assert.NotEqual(t, full.HeadHash, cut.HeadHash)
}

func TestVerifyLineAtLimit(t *testing.T) {
	// A line of exactly 64 KiB is read (and then rejected as not a
	// record); one byte more is too long.
	line := bytes.Repeat([]byte(" "), 65536)
	_, err := audit.Verify(bytes.NewReader(append(line, '\n')))
	require.ErrorContains(t, err, "line 1: not a record")
	_, err = audit.Verify(bytes.NewReader(append(line, ' ', '\n')))
	require.ErrorContains(t, err, "line 1: longer than 65536 bytes")
}

func TestVerifyReadError(t *testing.T) {
	boom := errors.New("disk on fire")
	valid := readFile(t, writeLog(t, 3))
	tests := []struct {
		name string
		r    io.Reader
	}{
		{name: "at once", r: iotest.ErrReader(boom)},
		{name: "after two lines", r: io.MultiReader(bytes.NewReader(valid[:len(valid)-20]), iotest.ErrReader(boom))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := audit.Verify(tt.r)
			require.ErrorIs(t, err, boom)
			require.NotErrorIs(t, err, audit.ErrTampered)
		})
	}
}

func FuzzVerify(f *testing.F) {
	valid := readFile(f, writeLog(f, 3))
	lines := splitLines(f, bytes.Clone(valid))
	f.Add(valid)
	f.Add([]byte{})
	f.Add([]byte("\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte("null\n"))
	f.Add(valid[:len(valid)-1])
	f.Add(valid[:len(valid)/2])
	f.Add(joinLines([][]byte{lines[0], lines[2], lines[1]}))
	f.Add(joinLines(lines[1:]))
	f.Add(bytes.Replace(valid, []byte("cluster-2"), []byte("cluster-7"), 1))
	f.Add(bytes.Replace(valid, []byte(`{"seq":2`), []byte(`{ "seq":2`), 1))
	f.Add(append(bytes.Clone(valid), "garbage\n"...))

	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := audit.Verify(bytes.NewReader(data))
		if err != nil {
			require.ErrorIs(t, err, audit.ErrTampered)
			return
		}
		again, err := audit.Verify(bytes.NewReader(data))
		require.NoError(t, err)
		require.Equal(t, s, again)
		require.Equal(t, uint64(bytes.Count(data, []byte("\n"))), s.Records)
		if s.Records > 0 {
			last := splitLines(t, data)[s.Records-1]
			require.Equal(t, s.HeadHash, decode(t, last).Hash)
		}
	})
}
