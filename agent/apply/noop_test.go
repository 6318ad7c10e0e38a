package apply

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

func TestUpToDate(t *testing.T) {
	const desired = `{"apiVersion":"networking.istio.io/v1","kind":"ServiceEntry",
		"metadata":{"name":"a","namespace":"ns","labels":{"relaymesh.io/owner":"me"},"annotations":{"relaymesh.io/parents":""}},
		"spec":{"hosts":["a.example.com"],"ports":[{"name":"tls","number":443}],"resolution":"DNS"}}`
	const owned = `{"f:metadata":{"f:annotations":{"f:relaymesh.io/parents":{}},"f:labels":{"f:relaymesh.io/owner":{}}},
		"f:spec":{"f:hosts":{},"f:ports":{"k:{\"name\":\"tls\"}":{".":{},"f:name":{},"f:number":{}}},"f:resolution":{}}}`
	live := func(edit func(o map[string]any)) *unstructured.Unstructured {
		o := decode(t, desired)
		md := o["metadata"].(map[string]any)
		md["uid"], md["resourceVersion"] = "u", "7"
		md["labels"].(map[string]any)["team"] = "theirs" // another manager's label
		o["status"] = map[string]any{"validationMessages": []any{}}
		if edit != nil {
			edit(o)
		}
		return &unstructured.Unstructured{Object: o}
	}
	entry := func(manager string, op metav1.ManagedFieldsOperationType, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, APIVersion: "networking.istio.io/v1",
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
	}
	apply := entry(FieldManager, metav1.ManagedFieldsOperationApply, owned)
	tests := []struct {
		name    string
		live    *unstructured.Unstructured
		entries []metav1.ManagedFieldsEntry
		want    bool
	}{
		{"exactly as applied", live(nil), []metav1.ManagedFieldsEntry{apply, entry("kubectl", metav1.ManagedFieldsOperationUpdate, `{"f:metadata":{"f:labels":{"f:team":{}}}}`)}, true},
		{"no entry of the agent", live(nil), nil, false},
		{"an update entry of the agent", live(nil), []metav1.ManagedFieldsEntry{apply, entry(FieldManager, metav1.ManagedFieldsOperationUpdate, `{"f:spec":{}}`)}, false},
		{"another version", live(nil), []metav1.ManagedFieldsEntry{func() metav1.ManagedFieldsEntry { e := apply; e.APIVersion = "networking.istio.io/v1beta1"; return e }()}, false},
		{"a field to remove", live(nil), []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationApply, `{"f:metadata":{"f:annotations":{"f:relaymesh.io/parents":{}},"f:labels":{"f:relaymesh.io/owner":{}}},
			"f:spec":{"f:gateways":{},"f:hosts":{},"f:ports":{"k:{\"name\":\"tls\"}":{".":{},"f:name":{},"f:number":{}}},"f:resolution":{}}}`)}, false},
		{"a field lost to another manager", live(nil), []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationApply, `{"f:metadata":{"f:annotations":{"f:relaymesh.io/parents":{}},"f:labels":{"f:relaymesh.io/owner":{}}},
			"f:spec":{"f:ports":{"k:{\"name\":\"tls\"}":{".":{},"f:name":{},"f:number":{}}},"f:resolution":{}}}`)}, false},
		{"a value changed", live(func(o map[string]any) { o["spec"].(map[string]any)["resolution"] = "STATIC" }), []metav1.ManagedFieldsEntry{apply}, false},
		{"a list item added by someone else", live(func(o map[string]any) {
			spec := o["spec"].(map[string]any)
			spec["ports"] = append(spec["ports"].([]any), map[string]any{"name": "http", "number": int64(80)})
		}), []metav1.ManagedFieldsEntry{apply}, false},
		{"a set is not understood", live(nil), []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationApply, `{"f:spec":{"f:hosts":{"v:\"a.example.com\"":{}}}}`)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.live.SetManagedFields(tt.entries)
			assert.Equal(t, tt.want, upToDate(&unstructured.Unstructured{Object: decode(t, desired)}, tt.live))
		})
	}
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := utiljson.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}
