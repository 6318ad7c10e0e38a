package controller

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// BenchmarkInputAfterAnEdit reads the translation's input after one
// TrafficPolicy edit with 1,000 clusters' KubernetesCluster, Mesh, Workload
// and Destination in the caches: "every-kind" reads every cache each time
// (as before issue 31's cached lists), "changed-kinds" only the edited one.
func BenchmarkInputAfterAnEdit(b *testing.B) {
	for _, cached := range []bool{false, true} {
		b.Run(map[bool]string{false: "every-kind", true: "changed-kinds"}[cached], func(b *testing.B) {
			c := &Controller{informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{}, typed: map[schema.GroupVersionResource]map[string]typedObject{},
				changed: map[schema.GroupVersionResource]*atomic.Bool{}, lists: map[schema.GroupVersionResource]any{}}
			handlers := map[schema.GroupVersionResource]cache.ResourceEventHandlerFuncs{}
			for _, gvr := range []schema.GroupVersionResource{gvrMesh, gvrWorkload, gvrDestination, gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDest, gvrCluster} {
				c.informers[gvr] = cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0, cache.Indexers{})
				if cached {
					handlers[gvr] = c.watchHandler(gvr, func() {})
				}
			}
			obj := func(kind, name string, rv, generation int64, spec map[string]any) *unstructured.Unstructured {
				return &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "x/v1alpha1", "kind": kind,
					"metadata": map[string]any{"name": name, "namespace": "relaymesh", "uid": "u-" + name, "resourceVersion": strconv.FormatInt(rv, 10), "generation": generation,
						"labels": map[string]any{"relaymesh.io/cluster": name}},
					"spec": spec,
				}}
			}
			for i := range 1000 {
				n := fmt.Sprintf("cluster-%04d", i)
				for gvr, o := range map[schema.GroupVersionResource]*unstructured.Unstructured{
					gvrCluster:     obj("KubernetesCluster", n, 1, 1, map[string]any{"mode": "relay"}),
					gvrMesh:        obj("Mesh", n, 1, 1, map[string]any{"cluster": n, "istio": map[string]any{"trustDomain": "cluster.local", "installation": map[string]any{"namespace": "istio-system"}}}),
					gvrWorkload:    obj("Workload", n, 1, 1, map[string]any{"mesh": map[string]any{"name": n, "namespace": "relaymesh"}, "kubernetes": map[string]any{"serviceAccountName": "web", "namespace": "shop", "podLabels": map[string]any{"app": "web"}}}),
					gvrDestination: obj("Destination", n, 1, 1, map[string]any{"mesh": map[string]any{"name": n, "namespace": "relaymesh"}, "kubeService": map[string]any{"name": "web", "namespace": "shop", "ports": []any{map[string]any{"port": int64(8080), "protocol": "http"}}}}),
				} {
					if err := c.informers[gvr].GetStore().Add(o); err != nil {
						b.Fatal(err)
					}
				}
			}
			policy := func(rv int64) *unstructured.Unstructured {
				return obj("TrafficPolicy", "timeouts", rv, rv, map[string]any{"policy": map[string]any{"requestTimeout": strconv.FormatInt(rv%7+1, 10) + "s"}})
			}
			old := policy(1)
			if err := c.informers[gvrTraffic].GetStore().Add(old); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Input(); err != nil {
				b.Fatal(err)
			}
			rv := int64(1)
			for b.Loop() {
				rv++
				p := policy(rv)
				if err := c.informers[gvrTraffic].GetStore().Update(p); err != nil {
					b.Fatal(err)
				}
				if cached {
					handlers[gvrTraffic].OnUpdate(old, p)
				}
				old = p
				in, err := c.Input()
				if err != nil || len(in.Clusters) != 1000 || len(in.TrafficPolicies) != 1 {
					b.Fatalf("input: %v", err)
				}
			}
		})
	}
}
