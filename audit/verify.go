package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ErrTampered is wrapped by every error that says a log's chain is broken:
// a line was edited, deleted, inserted, moved, torn or is not a record.
var ErrTampered = errors.New("audit: log tampered with or damaged")

// Summary describes a log that verified.
type Summary struct {
	// Records is the number of records, which is also the Seq of the last.
	Records uint64
	// HeadHash is the Hash of the last record; "" if there are none.
	HeadHash string
	// First and Last are the times of the first and last records; zero if
	// there are none.
	First, Last time.Time
}

// Verify reads a whole log from r and checks every line: that it is a
// record in canonical form with no unknown fields, a valid event and a UTC
// time; that seq counts up from 1; that prev is the previous line's hash;
// and that hash recomputes. An empty log verifies, with zero records.
//
// On failure the error wraps ErrTampered and names the 1-based line and the
// problem, e.g. "line 7: hash mismatch (record edited)". Errors reading r do
// not wrap ErrTampered.
//
// A log cut short after a complete line still verifies: compare Records and
// HeadHash with a head recorded elsewhere to detect that.
func Verify(r io.Reader) (Summary, error) {
	s, err := verify(r)
	if err != nil {
		return Summary{}, fmt.Errorf("audit: %w", err)
	}
	return s, nil
}

// lineError says what is wrong with one line of a log.
type lineError struct {
	line uint64
	msg  string
}

func (e *lineError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }
func (e *lineError) Unwrap() error { return ErrTampered }

func badLine(n uint64, format string, args ...any) error {
	return &lineError{line: n, msg: fmt.Sprintf(format, args...)}
}

func verify(r io.Reader) (Summary, error) {
	var s Summary
	prev := genesis
	br := bufio.NewReaderSize(r, maxLineLen+1) // the longest line and its "\n"
	for n := uint64(1); ; n++ {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return Summary{}, badLine(n, "longer than %d bytes", maxLineLen)
		case err == io.EOF && len(line) == 0:
			return s, nil
		case err == io.EOF:
			return Summary{}, badLine(n, "last line has no newline (torn write after a crash, or truncated)")
		case err != nil:
			return Summary{}, fmt.Errorf("read line %d: %w", n, err)
		}
		rec, err := checkLine(line[:len(line)-1], n, prev)
		if err != nil {
			return Summary{}, err
		}
		if n == 1 {
			s.First = rec.Time
		}
		s.Records, s.HeadHash, s.Last = rec.Seq, rec.Hash, rec.Time
		prev = rec.Hash
	}
}

// checkLine checks line n (without its "\n"), whose predecessor's hash is
// prev, and returns its record.
func checkLine(line []byte, n uint64, prev string) (Record, error) {
	if len(line) == 0 {
		return Record{}, badLine(n, "empty line")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil {
		return Record{}, badLine(n, "not a record: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Record{}, badLine(n, "data after the record")
	}
	switch {
	case r.Seq == n:
	case n == 1:
		return Record{}, badLine(n, "seq %d, want 1 (records deleted from the start)", r.Seq)
	case r.Seq > n:
		return Record{}, badLine(n, "seq %d follows %d (record deleted or reordered)", r.Seq, n-1)
	default:
		return Record{}, badLine(n, "seq %d follows %d (record inserted or reordered)", r.Seq, n-1)
	}
	if r.Prev != prev {
		if n == 1 {
			return Record{}, badLine(n, "prev is not 64 zeros (records deleted from the start)")
		}
		return Record{}, badLine(n, "prev does not match line %d's hash", n-1)
	}
	canonical, hash, err := r.seal()
	if err != nil {
		return Record{}, badLine(n, "cannot encode record: %v", err)
	}
	if r.Hash != hash {
		return Record{}, badLine(n, "hash mismatch (record edited)")
	}
	if !bytes.Equal(line, canonical) {
		return Record{}, badLine(n, "not in canonical form (record edited)")
	}
	if r.Time.Location() != time.UTC {
		return Record{}, badLine(n, "time is not in UTC")
	}
	if problems := r.problems(); len(problems) > 0 {
		return Record{}, badLine(n, "invalid event: %s", strings.Join(problems, "; "))
	}
	return r, nil
}
