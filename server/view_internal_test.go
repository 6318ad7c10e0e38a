package server

import (
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A packed snapshot that cannot be decoded is an error for Load, never "no
// snapshot": the mirror would take that for a departed cluster and delete
// its objects.
func TestAPackedSnapshotThatCannotBeReadIsAnError(t *testing.T) {
	snap := relaytest.Rich{Namespaces: 32}.Snapshot("c1")
	v := NewView()
	v.Accept("c1", snap, time.Now())
	require.True(t, v.Pack("c1", snap))
	for name, corrupt := range map[string]func([]byte) []byte{
		"truncated":   func(b []byte) []byte { return b[:len(b)/2] },
		"flipped":     func(b []byte) []byte { b = append([]byte(nil), b...); b[len(b)/2] ^= 0xff; return b },
		"size larger": func(b []byte) []byte { return append([]byte{0xff, 0xff, 0xff, 0xff, 0x7f}, b[1:]...) },
		"empty":       func([]byte) []byte { return []byte{} },
	} {
		t.Run(name, func(t *testing.T) {
			v.mu.Lock()
			good := v.clusters["c1"].packed
			v.clusters["c1"].packed = corrupt(good)
			v.mu.Unlock()
			defer func() { v.mu.Lock(); v.clusters["c1"].packed = good; v.mu.Unlock() }()

			got, err := v.Load("c1")
			assert.Error(t, err)
			assert.Nil(t, got)
			assert.True(t, v.HasSnapshot("c1"), "still held")
			hash, ok := v.SnapshotHash("c1")
			assert.True(t, ok)
			assert.Equal(t, snap.GetHash(), hash)
		})
	}
	got, err := v.Load("c1")
	require.NoError(t, err)
	assert.Equal(t, snap.GetHash(), got.GetHash())
}
