package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With Sync, concurrent records share flushes (group commit): every Record
// returns after its line is on disk, the chain stays intact, and far fewer
// flushes than records happen.
func TestGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(Config{Path: path, Sync: true})
	require.NoError(t, err)
	const writers, each = 32, 50
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				assert.NoError(t, l.Record(Event{Type: CertRenew, Result: ResultSuccess, Cluster: "c1"}))
			}
		}()
	}
	wg.Wait()
	l.mu.Lock()
	syncs, durable, seq := l.syncs, l.durable, l.seq
	l.mu.Unlock()
	assert.Equal(t, uint64(writers*each), seq)
	assert.Equal(t, seq, durable, "every returned record is durable")
	assert.Less(t, syncs, uint64(writers*each), "records share flushes")
	t.Logf("%d records, %d flushes", seq, syncs)
	require.NoError(t, l.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s, err := Verify(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, uint64(writers*each), s.Records)
}

// BenchmarkRecordSync measures records per second with Sync from 16
// concurrent callers (what the relay's Renew path does).
func BenchmarkRecordSync(b *testing.B) {
	l, err := Open(Config{Path: filepath.Join(b.TempDir(), "audit.log"), Sync: true})
	require.NoError(b, err)
	defer l.Close()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Record(Event{Type: CertRenew, Result: ResultSuccess, Cluster: "c1"}); err != nil {
				b.Error(err)
			}
		}
	})
}

// With Sync the lines recorded between flushes are written together by
// the flusher: a record is in the file when Record returns, and a write
// that fails fails every record of its batch and every one after it.
func TestSyncWritesEachRecordBeforeItReturns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(Config{Path: path, Sync: true})
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, l.Record(Event{Type: CertRenew, Result: ResultSuccess, Cluster: "c1"}))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		s, err := Verify(bytes.NewReader(b))
		require.NoError(t, err)
		assert.Equal(t, uint64(i+1), s.Records, "the record is on file when Record returns")
	}
	// The file fails under the log: the next flush's write fails.
	l.mu.Lock()
	require.NoError(t, l.f.Close())
	l.mu.Unlock()
	err = l.Record(Event{Type: CertRenew, Result: ResultSuccess, Cluster: "c1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "failed write")
	assert.Error(t, l.Record(Event{Type: CertRenew, Result: ResultSuccess, Cluster: "c1"}), "the log stays unusable")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s, err := Verify(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, uint64(3), s.Records, "nothing of the failed batch reached the file")
}
