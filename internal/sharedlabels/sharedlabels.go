// Package sharedlabels lets equal label maps share one map. A cluster's
// pods of one Deployment carry the same labels, and every Service that
// selects them repeats them per endpoint: a 100,000-pod snapshot of the
// benchmarks' shape holds 200,000 endpoint label maps of which 10,000
// differ. Decoded, each is its own map; shared, the rest are garbage.
//
// A shared map is read only from then on, as everything in an accepted
// snapshot or an informer's cache already is: writing to it would change
// every holder.
package sharedlabels

import (
	"maps"
	"reflect"
	"slices"
	"strconv"
)

// Table remembers one map per distinct set of labels. The zero Table is
// ready; it is not safe for concurrent use.
type Table struct {
	seen map[string]map[string]string
	// canon holds the address of every map in seen: a map shared already
	// (a snapshot shared as it was decoded, then again as it is accepted)
	// is found by it without being read.
	canon map[uintptr]struct{}
	prev  map[string]string
	key   []byte
	keys  []string
}

// Share returns a map equal to m: the first map seen with m's labels, or m
// itself. An empty or nil m is returned as it is.
func (t *Table) Share(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	// Endpoints come in address order, and neighbours are often pods of
	// one Deployment: comparing with the last map is cheaper than its key.
	addr := reflect.ValueOf(m).Pointer()
	if t.prev != nil && (addr == reflect.ValueOf(t.prev).Pointer() || maps.Equal(t.prev, m)) {
		return t.prev
	}
	if _, ok := t.canon[addr]; ok {
		t.prev = m
		return m
	}
	t.key = t.appendKey(t.key[:0], m)
	if s, ok := t.seen[string(t.key)]; ok {
		t.prev = s
		return s
	}
	if t.seen == nil {
		t.seen, t.canon = map[string]map[string]string{}, map[uintptr]struct{}{}
	}
	t.seen[string(t.key)] = m
	t.canon[addr] = struct{}{}
	t.prev = m
	return m
}

// appendKey appends to dst an encoding of m that two maps share exactly when
// they are equal: its keys in order, each key and value prefixed by its
// length.
func (t *Table) appendKey(dst []byte, m map[string]string) []byte {
	t.keys = t.keys[:0]
	for k := range m {
		t.keys = append(t.keys, k)
	}
	slices.Sort(t.keys)
	for _, k := range t.keys {
		dst = strconv.AppendInt(dst, int64(len(k)), 10)
		dst = append(dst, ':')
		dst = append(dst, k...)
		v := m[k]
		dst = strconv.AppendInt(dst, int64(len(v)), 10)
		dst = append(dst, ':')
		dst = append(dst, v...)
	}
	return dst
}
