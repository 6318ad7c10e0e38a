package audit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Config says where the log lives and how it is written.
type Config struct {
	// Path of the log file. Required. Open creates it with mode 0600 if it
	// does not exist and only ever appends to it.
	Path string
	// Clock gives the time of each record; default time.Now. Records are
	// stored in UTC whatever location it returns.
	Clock func() time.Time
	// Sync makes Record return only once its record is on disk (fsync), so
	// a record survives a power loss or kernel crash once Record returns.
	// Records written while a flush runs share the next one (group commit):
	// one flush per batch, not per record, so concurrent callers are not
	// serialised behind each other's flushes. Without it a returned record
	// has reached the operating system and survives a crash of the process
	// but not of the machine; the last records may then be lost, or the last
	// line left torn, which Open reports. Close syncs either way.
	Sync bool
}

// Validate reports every problem with the config at once.
func (c Config) Validate() error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, errors.New("path: required"))
	}
	return errors.Join(errs...)
}

// Log appends records to an audit log file. Create one with Open; it is
// safe for concurrent use.
type Log struct {
	clock func() time.Time
	sync  bool

	mu   sync.Mutex
	f    *os.File
	seq  uint64 // of the last record written; 0 when the log is empty
	head string // Hash of the last record; "" when the log is empty
	err  error  // once set, Record fails: the file was closed or a write failed

	// Group commit: durable is the last seq known to be on disk; syncing
	// is set while one caller flushes for everyone; flushed wakes the
	// waiters. Guarded by mu.
	// With Sync, pending holds the lines recorded since the last flush:
	// the flusher writes them in one write, then syncs (a write per
	// record was 28 % of the audit log's CPU on the Renew path, pprof).
	durable uint64
	syncing bool
	flushed *sync.Cond
	syncs   uint64 // flushes done, for tests
	pending []byte
}

var _ Recorder = (*Log)(nil)

// Open opens the log at cfg.Path, creating it if needed. If the file already
// holds records, Open verifies the whole chain first and refuses, with an
// error wrapping ErrTampered, to append to a broken one, including one whose
// last line was torn by a crash; otherwise new records continue the chain.
//
// Open also refuses a file that is not a regular file, or that group or
// others may write.
func Open(cfg Config) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("audit: config: %w", err)
	}
	f, created, err := openFile(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l, err := start(f, created, cfg)
	if err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

// openFile opens path for reading and appending, creating it with mode
// 0600 if it does not exist, and reports whether it did.
func openFile(path string) (f *os.File, created bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, false, err
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	return f, false, err
}

// start checks an opened file and reads the head of its chain.
func start(f *os.File, created bool, cfg Config) (*Log, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("audit: open %s: not a regular file", cfg.Path)
	}
	if perm := info.Mode().Perm(); perm&0o022 != 0 {
		return nil, fmt.Errorf("audit: open %s: mode %#o lets group or others write it; want 0600", cfg.Path, perm)
	}
	s, err := verify(f)
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: refusing to append to a broken log: %w", cfg.Path, err)
	}
	if created && cfg.Sync {
		if err := syncDir(filepath.Dir(cfg.Path)); err != nil {
			return nil, fmt.Errorf("audit: open %s: %w", cfg.Path, err)
		}
	}
	clock := cfg.Clock
	if clock == nil {
		clock = time.Now
	}
	l := &Log{clock: clock, sync: cfg.Sync, f: f, seq: s.Records, head: s.HeadHash, durable: s.Records}
	l.flushed = sync.NewCond(&l.mu)
	return l, nil
}

// syncDir makes a newly created file's directory entry durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Record appends e as the next record. It validates e first and returns an
// error wrapping ErrInvalidEvent, having written nothing, if e is invalid:
// Type or Result empty, Result not ResultSuccess or ResultFailure, a string
// longer than 1 KiB, not UTF-8 or holding a newline or other control
// character, more than 32 Details, or a record longer than 64 KiB.
//
// If a write fails the file may end in a torn line; Record then fails from
// that point on, and Open on the file reports the damage.
func (l *Log) Record(e Event) error {
	if err := e.check(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return fmt.Errorf("audit: record: %w", l.err)
	}
	r := Record{Seq: l.seq + 1, Time: l.clock().UTC(), Event: e, Prev: l.head}
	if r.Prev == "" {
		r.Prev = genesis
	}
	line, hash, err := r.seal()
	if err != nil {
		return fmt.Errorf("audit: record: %w", err)
	}
	if len(line) > maxLineLen {
		return fmt.Errorf("%w: record would be %d bytes, at most %d", ErrInvalidEvent, len(line), maxLineLen)
	}
	if l.sync {
		l.pending = append(append(l.pending, line...), '\n')
		l.seq, l.head = r.Seq, hash
		return l.waitDurable(r.Seq)
	}
	if _, err := l.f.Write(append(line, '\n')); err != nil {
		l.err = fmt.Errorf("log unusable after a failed write: %w", err)
		return fmt.Errorf("audit: record: %w", err)
	}
	l.seq, l.head = r.Seq, hash
	return nil
}

// waitDurable returns once record seq is on disk. Callers hold l.mu. The
// first caller to find no flush running writes and flushes everything
// recorded so far (outside the lock, so others keep appending); the rest
// wait for a flush that covers them.
func (l *Log) waitDurable(seq uint64) error {
	for l.durable < seq {
		if l.err != nil {
			return fmt.Errorf("audit: record: %w", l.err)
		}
		if l.syncing {
			l.flushed.Wait()
			continue
		}
		l.syncing = true
		target, f, buf := l.seq, l.f, l.pending
		l.pending = nil
		l.mu.Unlock()
		_, werr := f.Write(buf)
		var err error
		if werr == nil {
			err = f.Sync()
		}
		l.mu.Lock()
		l.syncing = false
		l.syncs++
		switch {
		case werr != nil && l.err == nil:
			l.err = fmt.Errorf("log unusable after a failed write: %w", werr)
		case err != nil && l.err == nil:
			l.err = fmt.Errorf("log unusable after a failed sync: %w", err)
		}
		if werr != nil {
			err = werr
		}
		if err == nil {
			l.durable = max(l.durable, target)
		}
		l.flushed.Broadcast()
	}
	return nil
}

// Head returns the sequence number and hash of the last record in the log,
// or 0 and "" if it is empty. Recording these somewhere else is what makes
// a truncated or rewritten log detectable.
func (l *Log) Head() (seq uint64, hash string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, l.head
}

// Close syncs and closes the file. Record fails after Close; further Close
// calls do nothing.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	for l.syncing {
		l.flushed.Wait()
	}
	f := l.f
	l.f = nil
	l.err = fmt.Errorf("log is closed: %w", os.ErrClosed)
	l.flushed.Broadcast()
	var werr error
	if len(l.pending) > 0 {
		// Recorded, not yet written: their callers wait (or gave up).
		_, werr = f.Write(l.pending)
		l.pending = nil
	}
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("audit: close: %w", err)
	}
	return nil
}
