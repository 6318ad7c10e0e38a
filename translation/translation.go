// Package translation holds what every translator shares: the Input (all
// clusters' discovered objects and the user's intent), the Output (per
// cluster, the Istio objects to apply, each with its parents) and the Report
// (a status for every user object). Translators (federation/, policy/) are
// pure functions from an Input to additions to an Output and a Report: no
// client calls, deterministic output.
package translation

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Input is everything translation reads.
type Input struct {
	Meshes       []discoveryv1alpha1.Mesh
	Workloads    []discoveryv1alpha1.Workload
	Destinations []discoveryv1alpha1.Destination

	VirtualMeshes       []networkingv1alpha1.VirtualMesh
	TrafficPolicies     []networkingv1alpha1.TrafficPolicy
	AccessPolicies      []networkingv1alpha1.AccessPolicy
	VirtualDestinations []networkingv1alpha1.VirtualDestination

	// Clusters are the registered clusters (the KubernetesClusters of the
	// server's namespace): their grants say which trust domains their
	// meshes may use (NewGrants). A mesh of a cluster not listed here may
	// use none, so a view without them federates no mesh.
	Clusters []multiclusterv1alpha1.KubernetesCluster
}

// Parent is a user object that produced an output.
type Parent struct{ Kind, Namespace, Name string }

func (p Parent) String() string { return p.Kind + "/" + p.Namespace + "/" + p.Name }

// Object is one output object for one cluster.
type Object struct {
	Cluster string
	Object  *unstructured.Unstructured
	Parents []Parent
}

// Output is the translated configuration of every cluster.
type Output struct {
	objects map[string]*Object // by cluster/apiVersion/kind/namespace/name
}

// NewOutput returns an empty output.
func NewOutput() *Output { return &Output{objects: map[string]*Object{}} }

// Add records an Istio object for cluster. spec is the Istio API message
// (istio.io/api); it is encoded as Istio's CRDs expect (protobuf JSON,
// lowerCamelCase). Adding the same object twice merges the parents; a
// different spec under the same name is merged by MergeSpecs (one
// DestinationRule per host, made of what federation and traffic policies
// each need) or is an error the caller must report.
func (o *Output) Add(cluster, apiVersion, kind, namespace, name string, spec proto.Message, parents ...Parent) error {
	return o.AddMeta(cluster, apiVersion, kind, namespace, name, nil, nil, spec, parents...)
}

// AddMeta is Add for an Istio object recorded with labels or annotations
// (a WorkloadEntry that joins a global Service, a ServiceEntry bound to a
// waypoint): two parents producing the object must agree on them as on
// its spec.
func (o *Output) AddMeta(cluster, apiVersion, kind, namespace, name string, labels, annotations map[string]string, spec proto.Message, parents ...Parent) error {
	obj, err := protoSpec(spec)
	if err != nil {
		return fmt.Errorf("encode %s %s/%s: %w", kind, namespace, name, err)
	}
	return o.addMeta(cluster, apiVersion, kind, namespace, name, labels, annotations, obj, parents)
}

// protoSpec is spec as Istio's CRDs hold it (protobuf JSON), decoded.
func protoSpec(spec proto.Message) (map[string]any, error) {
	if spec != nil {
		if m, ok := specMap(spec.ProtoReflect()); ok {
			return m, nil
		}
	}
	specJSON, err := protojson.MarshalOptions{}.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(specJSON, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// AddObject records an object whose spec is not an Istio API message (the
// Gateway API routes): spec is a Go value encoded with encoding/json, and
// is otherwise recorded as Add records a spec.
func (o *Output) AddObject(cluster, apiVersion, kind, namespace, name string, spec any, parents ...Parent) error {
	return o.AddObjectMeta(cluster, apiVersion, kind, namespace, name, nil, nil, spec, parents...)
}

// AddObjectMeta is AddObject for an object Istio reads labels or
// annotations of (a global Service's istio.io/global, a network gateway's
// topology.istio.io/network): they are recorded with it, and two parents
// producing the object must agree on them as on its spec.
func (o *Output) AddObjectMeta(cluster, apiVersion, kind, namespace, name string, labels, annotations map[string]string, spec any, parents ...Parent) error {
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode %s %s/%s: %w", kind, namespace, name, err)
	}
	var obj map[string]any
	if err := json.Unmarshal(specJSON, &obj); err != nil {
		return err
	}
	return o.addMeta(cluster, apiVersion, kind, namespace, name, labels, annotations, obj, parents)
}

func (o *Output) addMeta(cluster, apiVersion, kind, namespace, name string, labels, annotations map[string]string, spec map[string]any, parents []Parent) error {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	if len(labels) > 0 {
		u.SetLabels(maps.Clone(labels))
	}
	if len(annotations) > 0 {
		u.SetAnnotations(maps.Clone(annotations))
	}
	key := strings.Join([]string{cluster, apiVersion, kind, namespace, name}, "/")
	if cur, ok := o.objects[key]; ok {
		if !SameMetadata(cur.Object, u) {
			return fmt.Errorf("%s %s/%s in cluster %s: produced twice with different labels or annotations", kind, namespace, name, cluster)
		}
		curSpec, _ := cur.Object.Object["spec"].(map[string]any)
		merged, err := MergeSpecs(kind, curSpec, spec)
		if err != nil {
			return fmt.Errorf("%s %s/%s in cluster %s: %w", kind, namespace, name, cluster, err)
		}
		cur.Object.Object["spec"] = merged
		cur.Parents = mergeParents(cur.Parents, parents)
		return nil
	}
	o.objects[key] = &Object{Cluster: cluster, Object: u, Parents: mergeParents(nil, parents)}
	return nil
}

// MergeSpecs merges two specs of one object produced by two translators.
// Equal specs merge to themselves. Two DestinationRules for one host merge:
// subsets are united by name (a subset both define must be identical) and
// each trafficPolicy field may be set by one of them or identically by both.
// Istio reads one DestinationRule per host and namespace, so federation's
// TLS settings and a TrafficPolicy's subsets must end up in the same object.
// Anything else is an error naming the field. The result does not depend on
// the order of a and b.
func MergeSpecs(kind string, a, b map[string]any) (map[string]any, error) {
	if reflect.DeepEqual(a, b) {
		return a, nil
	}
	if kind != "DestinationRule" {
		return nil, errors.New("produced twice with different specs")
	}
	out := map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(a)) {
		out[k] = a[k]
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		v := b[k]
		cur, both := out[k]
		switch {
		case !both:
			out[k] = v
		case k == "subsets":
			merged, err := mergeSubsets(cur, v)
			if err != nil {
				return nil, err
			}
			out[k] = merged
		case k == "trafficPolicy":
			x, _ := cur.(map[string]any)
			y, _ := v.(map[string]any)
			tp := maps.Clone(x)
			for _, f := range slices.Sorted(maps.Keys(y)) {
				if have, ok := tp[f]; ok && !reflect.DeepEqual(have, y[f]) {
					return nil, fmt.Errorf("trafficPolicy.%s is set differently by two parents", f)
				}
				tp[f] = y[f]
			}
			out[k] = tp
		case !reflect.DeepEqual(cur, v):
			return nil, fmt.Errorf("%s is set differently by two parents", k)
		}
	}
	return out, nil
}

func mergeSubsets(a, b any) ([]any, error) {
	byName := map[string]any{}
	for _, list := range []any{a, b} {
		items, _ := list.([]any)
		for _, it := range items {
			m, _ := it.(map[string]any)
			name, _ := m["name"].(string)
			if have, ok := byName[name]; ok && !reflect.DeepEqual(have, it) {
				return nil, fmt.Errorf("subset %q is defined differently by two parents", name)
			}
			byName[name] = it
		}
	}
	out := make([]any, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[name])
	}
	return out, nil
}

func mergeParents(a, b []Parent) []Parent {
	seen := map[Parent]bool{}
	var out []Parent
	for _, p := range append(append([]Parent(nil), a...), b...) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Remove takes an object out of the output, if it is there.
func (o *Output) Remove(cluster, apiVersion, kind, namespace, name string) {
	delete(o.objects, strings.Join([]string{cluster, apiVersion, kind, namespace, name}, "/"))
}

// Put adds an already built object (used to split an output by cluster).
func (o *Output) Put(obj *Object) {
	u := obj.Object
	key := strings.Join([]string{obj.Cluster, u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName()}, "/")
	o.objects[key] = obj
}

// Objects returns every output object sorted by cluster, apiVersion, kind,
// namespace and name, with the parents annotation set.
func (o *Output) Objects() []*Object {
	keys := make([]string, 0, len(o.objects))
	for k := range o.objects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*Object, 0, len(keys))
	for _, k := range keys {
		obj := o.objects[k]
		var ps []string
		for _, p := range obj.Parents {
			ps = append(ps, p.String())
		}
		annotations := obj.Object.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[outputs.ParentsAnnotation] = strings.Join(ps, ",")
		obj.Object.SetAnnotations(annotations)
		out = append(out, obj)
	}
	return out
}

// SameMetadata says whether two versions of one output object carry the
// same labels and annotations, the parents annotation aside (each
// producer names its own parents).
func SameMetadata(a, b *unstructured.Unstructured) bool {
	strip := func(m map[string]string) map[string]string {
		m = maps.Clone(m)
		delete(m, outputs.ParentsAnnotation)
		return m
	}
	return maps.Equal(a.GetLabels(), b.GetLabels()) && maps.Equal(strip(a.GetAnnotations()), strip(b.GetAnnotations()))
}

// Clusters returns the clusters that have output.
func (o *Output) Clusters() []string {
	set := map[string]bool{}
	for _, obj := range o.objects {
		set[obj.Cluster] = true
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// ObjectKey names a user object in the Report.
type ObjectKey struct{ Kind, Namespace, Name string }

// Report is the status translation gives each user object.
type Report struct {
	statuses  map[ObjectKey]*common.Status
	targets   map[ObjectKey][]common.TargetStatus
	workloads map[ObjectKey]map[string]bool
}

// NewReport returns an empty report.
func NewReport() *Report {
	return &Report{statuses: map[ObjectKey]*common.Status{}, targets: map[ObjectKey][]common.TargetStatus{}, workloads: map[ObjectKey]map[string]bool{}}
}

// Accept marks an object Accepted (unless it is already Invalid).
func (r *Report) Accept(k ObjectKey, generation int64) {
	st := r.status(k, generation)
	if st.State == "" || st.State == common.StatePending {
		st.State = common.StateAccepted
	}
}

// Invalid marks an object Invalid with a message; it produces no output.
func (r *Report) Invalid(k ObjectKey, generation int64, format string, args ...any) {
	st := r.status(k, generation)
	st.State = common.StateInvalid
	st.Errors = append(st.Errors, fmt.Sprintf(format, args...))
}

// Warn adds a warning to an object's status; it does not change the state.
func (r *Report) Warn(k ObjectKey, generation int64, format string, args ...any) {
	st := r.status(k, generation)
	st.Warnings = append(st.Warnings, fmt.Sprintf(format, args...))
}

// WarnUntargeted warns about every Accepted object of kinds that has no
// per-target result: its selectors match nothing, so it does nothing.
func (r *Report) WarnUntargeted(kinds ...string) {
	for k, st := range r.statuses {
		if st.State == common.StateAccepted && len(r.targets[k]) == 0 && slices.Contains(kinds, k.Kind) {
			st.Warnings = append(st.Warnings, "destinationSelector matches no Destination: the policy has no effect")
		}
	}
}

// MaxWorkloads is how many source workloads a status lists; the rest are
// counted.
const MaxWorkloads = 64

// Workloads records source workloads (discovered Workload names) a policy
// selects; recording one twice is harmless.
func (r *Report) Workloads(k ObjectKey, names ...string) {
	if r.workloads[k] == nil {
		r.workloads[k] = map[string]bool{}
	}
	for _, n := range names {
		r.workloads[k][n] = true
	}
}

// SourceWorkloads returns the source workloads of k, sorted, at most
// MaxWorkloads of them followed by "… and N more".
func (r *Report) SourceWorkloads(k ObjectKey) []string {
	names := slices.Sorted(maps.Keys(r.workloads[k]))
	if len(names) > MaxWorkloads {
		names = append(names[:MaxWorkloads], fmt.Sprintf("… and %d more", len(names)-MaxWorkloads))
	}
	return names
}

// WorkloadCount is the number of source workloads of k.
func (r *Report) WorkloadCount(k ObjectKey) int { return len(r.workloads[k]) }

// Target records the verdict for one target (a Destination, a Mesh).
func (r *Report) Target(k ObjectKey, t common.TargetStatus) {
	r.targets[k] = append(r.targets[k], t)
}

// FailTarget marks k's result on target Failed with msg: the result
// recorded before for target (say Accepted, before its outputs could not be
// written) becomes Failed with msg added, or a new Failed result is added.
func (r *Report) FailTarget(k ObjectKey, target, msg string) {
	for i := range r.targets[k] {
		if t := &r.targets[k][i]; t.Target == target {
			t.State = common.StateFailed
			if !slices.Contains(t.Errors, msg) {
				t.Errors = append(t.Errors, msg)
			}
			return
		}
	}
	r.targets[k] = append(r.targets[k], common.TargetStatus{Target: target, State: common.StateFailed, Errors: []string{msg}})
}

func (r *Report) status(k ObjectKey, generation int64) *common.Status {
	st := r.statuses[k]
	if st == nil {
		st = &common.Status{State: common.StatePending}
		r.statuses[k] = st
	}
	st.ObservedGeneration = generation
	return st
}

// Status returns an object's status and per-target results (sorted).
func (r *Report) Status(k ObjectKey) (common.Status, []common.TargetStatus, bool) {
	st, ok := r.statuses[k]
	if !ok {
		return common.Status{}, nil, false
	}
	ts := append([]common.TargetStatus(nil), r.targets[k]...)
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].Target < ts[j].Target })
	return *st, ts, true
}

// Merge adds other's statuses and per-target results to r, as if the
// translator that wrote other had written to r: errors, warnings and targets
// are appended, Invalid wins over Accepted and Accepted over Pending. The
// translation controller uses it to assemble the report from translations of
// parts of the input.
func (r *Report) Merge(other *Report) {
	rank := map[common.ApprovalState]int{common.StatePending: 0, common.StateAccepted: 1, common.StateInvalid: 2}
	for k, o := range other.statuses {
		st := r.statuses[k]
		if st == nil {
			st = &common.Status{State: common.StatePending}
			r.statuses[k] = st
		}
		st.ObservedGeneration = o.ObservedGeneration
		if rank[o.State] > rank[st.State] {
			st.State = o.State
		}
		st.Errors = append(st.Errors, o.Errors...)
		st.Warnings = append(st.Warnings, o.Warnings...)
	}
	for k, ts := range other.targets {
		r.targets[k] = append(r.targets[k], ts...)
	}
	for k, ws := range other.workloads {
		r.Workloads(k, slices.Collect(maps.Keys(ws))...)
	}
}

// Keys returns every reported object, sorted.
func (r *Report) Keys() []ObjectKey {
	out := make([]ObjectKey, 0, len(r.statuses))
	for k := range r.statuses {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Kind+"/"+a.Namespace+"/"+a.Name < b.Kind+"/"+b.Namespace+"/"+b.Name
	})
	return out
}
