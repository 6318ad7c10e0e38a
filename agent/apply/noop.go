package apply

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// upToDate reports whether server-side applying obj to live would change
// nothing, so the request can be skipped: the agent's one apply entry in
// live's managed fields owns exactly obj's fields, and live holds obj's
// values. It answers false whenever it cannot tell (sets, list indexes, a
// value the API server normalized, a list another manager added items to,
// another entry of the agent's), and the object is then applied; so it may
// cost a request, never a change.
func upToDate(obj, live *unstructured.Unstructured) bool {
	var entry *metav1.ManagedFieldsEntry
	for _, e := range live.GetManagedFields() {
		if e.Manager != FieldManager {
			continue
		}
		if entry != nil || e.Operation != metav1.ManagedFieldsOperationApply || e.Subresource != "" {
			return false
		}
		entry = &e
	}
	if entry == nil || entry.APIVersion != obj.GetAPIVersion() || entry.FieldsType != "FieldsV1" || entry.FieldsV1 == nil {
		return false
	}
	var trie map[string]any
	if err := utiljson.Unmarshal(entry.FieldsV1.GetRawBytes(), &trie); err != nil {
		return false
	}
	p := paths{set: map[string]bool{}, listKeys: map[string][]string{}}
	if !p.owned(trie, "") {
		return false
	}
	want := paths{set: map[string]bool{}, listKeys: p.listKeys}
	for k, v := range obj.Object {
		switch k {
		case "apiVersion", "kind": // not tracked in managed fields
		case "metadata":
			md, _ := v.(map[string]any)
			for mk, mv := range md {
				if mk != "name" && mk != "namespace" {
					want.values(mv, "f:metadata"+sep+"f:"+mk)
				}
			}
		default:
			want.values(v, "f:"+k)
		}
	}
	return reflect.DeepEqual(p.set, want.set) && subset(obj.Object, live.Object)
}

// sep separates the elements of a path; it cannot occur in a field name.
const sep = "\x00"

// paths is a set of field paths, in managed-fields notation ("f:spec",
// "k:{...}"), with the key fields of every associative list seen.
type paths struct {
	set      map[string]bool
	listKeys map[string][]string
}

// owned collects the members of a FieldsV1 trie. Plain fields, associative
// list items and "." (the node itself) are understood; anything else (sets,
// list indexes) makes it return false.
func (p paths) owned(trie map[string]any, prefix string) bool {
	if len(trie) == 0 && prefix != "" {
		p.set[prefix] = true
		return true
	}
	for k, v := range trie {
		child, ok := v.(map[string]any)
		if !ok {
			return false
		}
		elem := k
		switch {
		case k == ".":
			p.set[prefix] = true
			continue
		case strings.HasPrefix(k, "f:"):
		case strings.HasPrefix(k, "k:"):
			var key map[string]any
			if err := utiljson.Unmarshal([]byte(k[2:]), &key); err != nil || len(key) == 0 {
				return false
			}
			names := slices.Sorted(maps.Keys(key))
			if prev, seen := p.listKeys[prefix]; seen && !slices.Equal(prev, names) {
				return false
			}
			p.listKeys[prefix] = names
			canon, err := json.Marshal(key)
			if err != nil {
				return false
			}
			elem = "k:" + string(canon)
		default:
			return false
		}
		path := elem
		if prefix != "" {
			path = prefix + sep + elem
		}
		if !p.owned(child, path) {
			return false
		}
	}
	return true
}

// values collects the fields an apply of v at prefix would own: the leaves
// of maps, lists as a whole, except associative lists (those listKeys
// names), whose items are owned one by one.
func (p paths) values(v any, prefix string) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			p.set[prefix] = true
			return
		}
		for k, c := range v {
			p.values(c, prefix+sep+"f:"+k)
		}
	case []any:
		names, ok := p.listKeys[prefix]
		if !ok {
			p.set[prefix] = true
			return
		}
		for _, item := range v {
			m, ok := item.(map[string]any)
			key := map[string]any{}
			for _, n := range names {
				if m[n] == nil {
					ok = false
				}
				key[n] = m[n]
			}
			canon, err := json.Marshal(key)
			if !ok || err != nil {
				p.set[prefix+sep+"?"] = true // cannot tell: never equal to owned
				return
			}
			itemPath := prefix + sep + "k:" + string(canon)
			p.set[itemPath] = true
			for k, c := range m {
				p.values(c, itemPath+sep+"f:"+k)
			}
		}
	default:
		p.set[prefix] = true
	}
}

// subset reports whether every field of want is in have with an equal
// value; maps may hold more fields in have, anything else must be equal.
func subset(want, have any) bool {
	wm, ok := want.(map[string]any)
	if !ok {
		return reflect.DeepEqual(want, have)
	}
	hm, ok := have.(map[string]any)
	if !ok {
		return false
	}
	for k, w := range wm {
		h, ok := hm[k]
		if !ok || !subset(w, h) {
			return false
		}
	}
	return true
}
