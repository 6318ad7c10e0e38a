package sharedlabels_test

import (
	"fmt"
	"maps"
	"reflect"
	"testing"

	"github.com/relaymesh/relaymesh/internal/sharedlabels"
	"github.com/stretchr/testify/assert"
)

func same(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func TestShare(t *testing.T) {
	var tab sharedlabels.Table
	a := map[string]string{"app": "a", "version": "v1"}
	b := map[string]string{"version": "v1", "app": "a"}
	c := map[string]string{"app": "a", "version": "v2"}
	d := map[string]string{"app": "a", "version": "v1"}
	assert.True(t, same(a, tab.Share(a)), "the first of its labels is kept")
	assert.True(t, same(a, tab.Share(b)), "equal labels share the first map")
	assert.True(t, same(c, tab.Share(c)))
	assert.True(t, same(a, tab.Share(d)), "found again after another map")
	assert.True(t, same(c, tab.Share(c)), "a shared map is itself")
	assert.True(t, same(a, tab.Share(a)), "also when it is not the last one")
	assert.Equal(t, map[string]string{"app": "a", "version": "v1"}, a, "unchanged")
	assert.Nil(t, tab.Share(nil))
	empty := map[string]string{}
	assert.True(t, same(empty, tab.Share(empty)))
}

// Maps that differ are never shared, however their keys and values could
// be run together: the encoding is injective.
func TestShareNeverJoinsDifferentLabels(t *testing.T) {
	var tab sharedlabels.Table
	sets := []map[string]string{
		{"ab": "c"}, {"a": "bc"}, {"a": "b", "c": ""}, {"a": "b:c"}, {"a:b": "c"}, {"a": "b", "": "c"},
		{"1:a": ""}, {"": "1:a"}, {"a": "b"}, {"a": "b", "c": "d"}, {"a": "b", "cd": ""}, {"a": ""}, {"": ""},
	}
	for i, m := range sets {
		got := tab.Share(maps.Clone(m))
		assert.Equal(t, m, got, "set %d", i)
	}
	for i := range sets {
		for j := range sets {
			if i != j {
				assert.False(t, maps.Equal(sets[i], sets[j]), "the sets above differ: %d and %d", i, j)
			}
		}
	}
}

func FuzzShare(f *testing.F) {
	f.Add("a", "b", "c", "d", "a", "b")
	f.Add("ab", "c", "a", "bc", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		var tab sharedlabels.Table
		m1 := map[string]string{k1: v1, k2: v2}
		m2 := map[string]string{k3: v3}
		m3 := map[string]string{k2: v2, k1: v1}
		for _, m := range []map[string]string{m1, m2, m3, m2, m1} {
			want := maps.Clone(m)
			assert.Equal(t, want, tab.Share(m), "a shared map has the same labels")
		}
	})
}

func BenchmarkShare(b *testing.B) {
	ms := make([]map[string]string, 1000)
	for i := range ms {
		ms[i] = map[string]string{"app": fmt.Sprint("app-", i%20), "version": "v1", "team": "t", "pod-template-hash": fmt.Sprint(i % 40)}
	}
	b.ReportAllocs()
	for b.Loop() {
		var tab sharedlabels.Table
		for _, m := range ms {
			tab.Share(m)
		}
	}
}
