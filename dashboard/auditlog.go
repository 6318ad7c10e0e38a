package dashboard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/audit"
)

// maxRecentRecords is how many of the newest audit records the page shows.
const maxRecentRecords = 200

// AuditLog is the Audit log page: the chain verified by audit.Verify, and
// the newest records of exactly the bytes that were verified.
type AuditLog struct {
	// Configured is false when the server was given no log to show.
	Configured bool `json:"configured"`
	Verified   bool `json:"verified"`
	// Error says why the log did not verify (or could not be read).
	Error    string    `json:"error,omitempty"`
	Records  uint64    `json:"records"`
	HeadHash string    `json:"headHash,omitempty"`
	First    time.Time `json:"first,omitzero"`
	Last     time.Time `json:"last,omitzero"`
	// ServerRecords and ServerHead are the head the running server wrote
	// last (Log.Head): a file with fewer records, or another hash at that
	// record, was cut short or rewritten behind the server's back.
	ServerRecords uint64 `json:"serverRecords,omitempty"`
	ServerHead    string `json:"serverHead,omitempty"`
	// Truncated: the file holds fewer records than the server wrote.
	Truncated bool `json:"truncated"`
	// Recent are the newest records, newest first.
	Recent []audit.Record `json:"recent"`
}

// auditReader verifies the audit log file and keeps the newest records.
// Verifying reads the whole file; the answer is kept until the file's size
// or modification time changes.
type auditReader struct {
	path string
	head func() (uint64, string)

	mu      sync.Mutex
	size    int64
	mtime   time.Time
	seq     uint64
	cached  *AuditLog
	watched string
}

// read verifies the log and returns the page's data.
func (a *auditReader) read() *AuditLog {
	// (The cache is keyed by the file only; the server's head is compared
	// on every read.)
	if a.path == "" {
		return &AuditLog{Recent: []audit.Record{}}
	}
	// The server's head first: the file can only be longer afterwards.
	var serverSeq uint64
	var serverHash string
	if a.head != nil {
		serverSeq, serverHash = a.head()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out, watched, err := a.verify(serverSeq)
	if err != nil {
		out = &AuditLog{Configured: true, Error: err.Error(), Recent: []audit.Record{}}
	}
	res := *out
	res.ServerRecords, res.ServerHead = serverSeq, serverHash
	switch {
	case res.Error != "" || serverSeq == 0:
	case serverSeq > res.Records:
		res.Truncated, res.Verified = true, false
		res.Error = fmt.Sprintf("the file holds %d records, the server wrote %d: the log was cut short", res.Records, serverSeq)
	case watched != serverHash:
		res.Verified = false
		res.Error = fmt.Sprintf("record %d in the file is not the one the server wrote: the log was rewritten", serverSeq)
	}
	return &res
}

// verify reads the complete lines of the file as it is now. It also
// returns the hash of record seq (when the file has it).
func (a *auditReader) verify(seq uint64) (*AuditLog, string, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, "", fmt.Errorf("open the audit log: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, "", err
	}
	if a.cached != nil && info.Size() == a.size && info.ModTime().Equal(a.mtime) && seq == a.seq {
		return a.cached, a.watched, nil
	}
	// Only complete lines: the server may be half way through appending.
	end, err := lastNewline(f, info.Size())
	if err != nil {
		return nil, "", err
	}
	tail := &lineTail{keep: maxRecentRecords, watch: seq}
	sum, verr := audit.Verify(io.TeeReader(io.NewSectionReader(f, 0, end), tail))
	out := &AuditLog{Configured: true, Verified: verr == nil, Records: sum.Records, HeadHash: sum.HeadHash, First: sum.First, Last: sum.Last,
		Recent: make([]audit.Record, 0, len(tail.lines))}
	if verr != nil {
		out.Error = verr.Error()
	}
	for i := len(tail.lines) - 1; i >= 0; i-- {
		var r audit.Record
		if err := json.Unmarshal(tail.lines[i], &r); err != nil {
			continue // not a record: Verify said which line
		}
		out.Recent = append(out.Recent, r)
	}
	var watched string
	if tail.watched != nil {
		var r audit.Record
		if json.Unmarshal(tail.watched, &r) == nil {
			watched = r.Hash
		}
	}
	a.size, a.mtime, a.seq, a.cached, a.watched = info.Size(), info.ModTime(), seq, out, watched
	return out, watched, nil
}

// lastNewline returns the length of the file's prefix that ends with its
// last "\n" (0 if none) among its first size bytes.
func lastNewline(f io.ReaderAt, size int64) (int64, error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	for end := size; end > 0; {
		start := max(0, end-chunk)
		n, err := f.ReadAt(buf[:end-start], start)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("read the audit log: %w", err)
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return start + int64(i) + 1, nil
		}
		end = start
	}
	return 0, nil
}

// lineTail is an io.Writer that keeps the last keep lines written to it
// (without their "\n") and line number watch, each at most maxLine bytes
// (longer ones are not records: Verify refuses them).
type lineTail struct {
	keep    int
	lines   [][]byte
	watch   uint64
	watched []byte

	n       uint64 // complete lines seen
	partial []byte
	tooLong bool
}

const maxLine = 64 << 10

func (t *lineTail) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.add(p)
			break
		}
		t.add(p[:i])
		t.n++
		if !t.tooLong {
			line := t.partial
			if t.n == t.watch {
				t.watched = line
			}
			if len(t.lines) == t.keep {
				copy(t.lines, t.lines[1:])
				t.lines = t.lines[:t.keep-1]
			}
			t.lines = append(t.lines, line)
		}
		t.partial, t.tooLong = nil, false
		p = p[i+1:]
	}
	return n, nil
}

// add appends b to the line being read, a copy: b is the reader's buffer.
func (t *lineTail) add(b []byte) {
	if t.tooLong || len(t.partial)+len(b) > maxLine {
		t.tooLong, t.partial = true, nil
		return
	}
	t.partial = append(t.partial, b...)
}
