package shardedcm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

var testKind = Kind{Prefix: "test-map-", Label: "test-map", What: "test record"}

func testMap(t *testing.T) *Map[string] {
	t.Helper()
	codec := Codec[string]{
		Parse: func(s string) (string, error) {
			if s == "" {
				return "", errors.New("empty")
			}
			return s, nil
		},
		Encode:   func(s string) string { return s },
		Replaces: func(v, stored string, ok bool) bool { return true },
	}
	return New(fake.NewClientset(), "ns", testKind, codec, nil)
}

func shardCopy(cluster, value, rv string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: testKind.ShardName(cluster), Namespace: "ns", ResourceVersion: rv},
		Data: map[string]string{cluster: value}}
}

// A replica reads its own write at once, and the watch's copies from
// before that write, arriving after it, do not take it back; the watch's
// own copy of the write, and anything later, are applied as they come.
func TestOwnWriteIsNotUndoneByAStaleWatch(t *testing.T) {
	m := testMap(t)
	shard := testKind.ShardName("c1")
	var told []string
	m.OnChange(func(c string) { told = append(told, c) })

	m.apply(shard, shardCopy("c1", "v1", "10"), true)
	got, _ := m.Get("c1")
	assert.Equal(t, "v1", got, "the writer's own write is read at once")
	assert.Equal(t, []string{"c1"}, told)

	// The watch still shows the copy before the write.
	stale := shardCopy("c1", "v0", "9")
	require.NoError(t, m.informer.GetStore().Add(stale))
	m.reload(shard)
	got, _ = m.Get("c1")
	assert.Equal(t, "v1", got, "an older copy from the watch does not undo the write")
	assert.Len(t, told, 1)

	// The watch catches up, then moves past the write.
	require.NoError(t, m.informer.GetStore().Update(shardCopy("c1", "v1", "10")))
	m.reload(shard)
	require.NoError(t, m.informer.GetStore().Update(shardCopy("c1", "v2", "12")))
	m.reload(shard)
	got, _ = m.Get("c1")
	assert.Equal(t, "v2", got)

	// A write that returns later than the watch's newer copy (another
	// replica wrote after it) is not applied over that copy.
	m.apply(shard, shardCopy("c1", "v1-late", "11"), true)
	got, _ = m.Get("c1")
	assert.Equal(t, "v2", got)
	assert.Equal(t, []string{"c1", "c1"}, told)

	// A deletion from the watch applies whatever was written.
	m.apply(shard, shardCopy("c1", "v3", "13"), true)
	require.NoError(t, m.informer.GetStore().Delete(shardCopy("c1", "v2", "12")))
	m.reload(shard)
	_, ok := m.Get("c1")
	assert.False(t, ok)
}

// resourceVersions that are not integers are never compared: the
// writer's copy is then left to the watch.
func TestUncomparableVersionsAreLeftToTheWatch(t *testing.T) {
	m := testMap(t)
	shard := testKind.ShardName("c1")
	require.NoError(t, m.informer.GetStore().Add(shardCopy("c1", "v0", "opaque-a")))
	m.reload(shard)
	m.apply(shard, shardCopy("c1", "v1", "opaque-b"), true)
	got, _ := m.Get("c1")
	assert.Equal(t, "v0", got)
	require.NoError(t, m.informer.GetStore().Update(shardCopy("c1", "v1", "opaque-b")))
	m.reload(shard)
	got, _ = m.Get("c1")
	assert.Equal(t, "v1", got)
}
