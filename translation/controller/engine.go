package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/internal/fastjson"
	"github.com/relaymesh/relaymesh/policy"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Engine translates incrementally. It splits translation into units whose
// inputs it can name, remembers each unit's result with a fingerprint of
// those inputs, and recomputes only the units whose fingerprint changed:
//
//   - fed/<destination>: the federation outputs of one Destination
//     (federation.Plan.Export). Fingerprint: the Destination and
//     Plan.ExportDeps (its VirtualMesh's spec, the members' names, clusters
//     and root namespaces, the exporting mesh, the host's address, and on a
//     flat network the identities of its pods).
//   - fed-finish: every VirtualMesh's per-mesh objects and status
//     (federation.Plan.Finish). Fingerprint: every VirtualMesh and Mesh, and
//     the notes of every fed/ unit.
//   - traffic/<policy>: one connected group of TrafficPolicies and the
//     Destinations they select, shift or mirror to (conflicts and subsets are
//     decided within such a group), with the Workloads their sources select.
//   - access/<destination>: the AuthorizationPolicy of one Destination, from
//     the AccessPolicies selecting it and the Workloads their sources select;
//     access-idle: AccessPolicies that select nothing.
//   - vd: every VirtualDestination (they claim hostnames from each other);
//     fingerprint: every VirtualDestination, VirtualMesh, Mesh, Destination
//     and Workload.
//
// Namespace tenancy (ScopePolicies) runs every time over the policies outside
// the admin namespace and the Destinations they select. Which policies select
// which Destinations and Workloads is kept in indexes updated from the
// objects that changed. An object's version is its UID and generation (what
// the apiserver bumps on a spec change), else a hash of the object.
//
// Two units producing one object is something only a full translation can
// decide (Output.Add reports it on the right parent): the engine then
// translates in full, which is always correct, and starts over.
//
// Whether the engine agrees with Translate is checked by tests that compare
// the two after random edits and over every golden input.
type Engine struct {
	admin string

	tpDest index // TrafficPolicy → Destinations it selects
	apDest index // AccessPolicy → Destinations it selects
	tpWork index // TrafficPolicy → Workloads its sources select
	apWork index // AccessPolicy → Workloads its sources select

	// Every object of the last cycle with its key and version, kept up to
	// date by the next (newCycle), and the last cycle's hashes
	// (cycle.meshes, grants).
	seen           map[objID]*seenObject
	cycle          uint64
	meshes, grants string

	units    map[string]*unit
	clusters map[string]map[string]*slot      // cluster → object key → slot
	touched  map[string]map[string]*published // slots touched by this apply → what they published before
	dirty    map[string]bool
	report   *translation.Report
	lastGood map[translation.ObjectKey]*keptVirtualMesh
	stats    Stats
}

// Stats describes the last translation.
type Stats struct {
	Units      int  // units in the last translation
	Recomputed int  // of which were recomputed
	Full       bool // the last translation was a full one
	FullReason string
}

type unit struct {
	deps    string
	objects []*published
	report  *translation.Report
	notes   []federation.Note
	kept    bool // last good outputs of an Invalid VirtualMesh
}

// published is one output object as the engine keeps it: encoded for the
// wire only (the decoded form would cost about four times the memory).
type published struct {
	unit    string
	cluster string
	key     string
	parents []translation.Parent
	wire    *relaypb.OutputObject
}

// keptVirtualMesh is what a VirtualMesh produced the last time it was valid.
type keptVirtualMesh struct {
	generation int64
	serial     int
	units      []*unit
	finishUnit *unit
	finish     []*published
}

// NewEngine returns an engine for a server whose namespace is admin.
func NewEngine(admin string) *Engine {
	e := &Engine{admin: admin}
	e.reset()
	return e
}

func (e *Engine) reset() {
	e.seen = map[objID]*seenObject{}
	e.meshes, e.grants = "", ""
	e.tpDest, e.apDest, e.tpWork, e.apWork = newIndex(), newIndex(), newIndex(), newIndex()
	e.units = map[string]*unit{}
	if e.clusters == nil {
		e.clusters = map[string]map[string]*slot{}
		e.touched = map[string]map[string]*published{}
		e.dirty = map[string]bool{}
	}
	e.lastGood = map[translation.ObjectKey]*keptVirtualMesh{}
}

// Stats returns what the last Translate did.
func (e *Engine) Stats() Stats { return e.stats }

// Report returns the last translation's report.
func (e *Engine) Report() *translation.Report { return e.report }

// Dirty returns the clusters whose objects changed since the last call, and
// forgets them.
func (e *Engine) Dirty() []string {
	out := slices.Sorted(maps.Keys(e.dirty))
	e.dirty = map[string]bool{}
	return out
}

// ClusterObjects returns a cluster's objects as published, sorted by key.
func (e *Engine) ClusterObjects(cluster string) []*relaypb.OutputObject {
	objs := e.clusters[cluster]
	out := make([]*relaypb.OutputObject, 0, len(objs))
	for _, k := range slices.Sorted(maps.Keys(objs)) {
		out = append(out, objs[k].eff.wire)
	}
	return out
}

// ClusterParents maps each parent with objects in cluster to the sorted keys
// (apiVersion/kind/namespace/name) of those objects.
func (e *Engine) ClusterParents(cluster string) map[translation.Parent][]string {
	out := map[translation.Parent][]string{}
	for _, k := range slices.Sorted(maps.Keys(e.clusters[cluster])) {
		for _, p := range e.clusters[cluster][k].eff.parents {
			out[p] = append(out[p], k)
		}
	}
	return out
}

// Objects decodes every object of the last translation, sorted like
// Output.Objects (for tests and debugging; publishing uses ClusterObjects).
func (e *Engine) Objects() []*translation.Object {
	var out []*translation.Object
	for _, c := range slices.Sorted(maps.Keys(e.clusters)) {
		objs := e.clusters[c]
		for _, k := range slices.Sorted(maps.Keys(objs)) {
			p := objs[k].eff
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(p.wire.Manifest); err != nil {
				continue // cannot happen: the engine encoded it
			}
			out = append(out, &translation.Object{Cluster: p.cluster, Object: u, Parents: p.parents})
		}
	}
	return out
}

// version is an object's UID and generation, or a hash of it and its spec
// when it has neither (objects that did not come from an apiserver).
func version(m *metav1.ObjectMeta, spec func() any) string {
	if m.UID != "" && m.Generation > 0 {
		return string(m.UID) + "/" + strconv.FormatInt(m.Generation, 10)
	}
	b, _ := json.Marshal(struct {
		M *metav1.ObjectMeta
		S any
	}{m, spec()})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// cycle holds one translation's view of the input.
type cycle struct {
	in      *translation.Input
	dests   map[string]*discoveryv1alpha1.Destination
	works   map[string]*discoveryv1alpha1.Workload
	tps     map[string]*networkingv1alpha1.TrafficPolicy
	aps     map[string]*networkingv1alpha1.AccessPolicy
	vers    map[string]string
	changed map[string]bool // keys whose version differs from the last cycle (or are new)
	removed []string
	meshes  string // hash of every Mesh
	grants  string // hash of every KubernetesCluster (their trust domain grants)

	keys   map[string][]string // object keys by kind (sorted by sortedKeys)
	sorted map[string]bool
	kinds  map[string]bool // kinds with an object changed, added or removed
}

func objectKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// objID names an object of the input without building its key.
type objID struct{ kind, ns, name string }

// seenObject is what the engine worked out for one object: its key, and
// its version with the UID and generation it came from, and the last cycle
// that saw it. A cycle takes both as they are for an object of the same
// UID and generation, instead of building two strings per object: a cycle
// reads the whole fleet, and in a storm of 10,000 agents reading it
// (newCycle) was 61 % of translation's CPU, those strings a large part
// (issue 31).
type seenObject struct {
	key, ver string
	uid      types.UID
	gen      int64
	cycle    uint64
}

func (e *Engine) newCycle(in *translation.Input) *cycle {
	e.cycle++
	c := &cycle{in: in, dests: make(map[string]*discoveryv1alpha1.Destination, len(in.Destinations)), works: make(map[string]*discoveryv1alpha1.Workload, len(in.Workloads)),
		tps: map[string]*networkingv1alpha1.TrafficPolicy{}, aps: map[string]*networkingv1alpha1.AccessPolicy{},
		vers: make(map[string]string, len(e.seen)), changed: map[string]bool{},
		keys: map[string][]string{}, sorted: map[string]bool{}, kinds: map[string]bool{}}
	distinct := 0 // objects in the input, each counted once
	distinct += versions(e, c, in.Meshes, "Mesh", func(m *discoveryv1alpha1.Mesh) *metav1.ObjectMeta { return &m.ObjectMeta }, func(m *discoveryv1alpha1.Mesh) any { return m.Spec }, nil)
	distinct += versions(e, c, in.Destinations, "Destination", func(d *discoveryv1alpha1.Destination) *metav1.ObjectMeta { return &d.ObjectMeta }, func(d *discoveryv1alpha1.Destination) any { return d.Spec }, c.dests)
	distinct += versions(e, c, in.Workloads, "Workload", func(w *discoveryv1alpha1.Workload) *metav1.ObjectMeta { return &w.ObjectMeta }, func(w *discoveryv1alpha1.Workload) any { return w.Spec }, c.works)
	distinct += versions(e, c, in.TrafficPolicies, "TrafficPolicy", func(p *networkingv1alpha1.TrafficPolicy) *metav1.ObjectMeta { return &p.ObjectMeta }, func(p *networkingv1alpha1.TrafficPolicy) any { return p.Spec }, c.tps)
	distinct += versions(e, c, in.AccessPolicies, "AccessPolicy", func(p *networkingv1alpha1.AccessPolicy) *metav1.ObjectMeta { return &p.ObjectMeta }, func(p *networkingv1alpha1.AccessPolicy) any { return p.Spec }, c.aps)
	distinct += versions(e, c, in.VirtualMeshes, "VirtualMesh", func(v *networkingv1alpha1.VirtualMesh) *metav1.ObjectMeta { return &v.ObjectMeta }, func(v *networkingv1alpha1.VirtualMesh) any { return v.Spec }, nil)
	distinct += versions(e, c, in.VirtualDestinations, "VirtualDestination", func(v *networkingv1alpha1.VirtualDestination) *metav1.ObjectMeta { return &v.ObjectMeta }, func(v *networkingv1alpha1.VirtualDestination) any { return v.Spec }, nil)
	distinct += versions(e, c, in.Clusters, "KubernetesCluster", func(k *multiclusterv1alpha1.KubernetesCluster) *metav1.ObjectMeta { return &k.ObjectMeta }, func(k *multiclusterv1alpha1.KubernetesCluster) any { return k.Spec }, nil)
	// Objects are told apart by kind, namespace and name, as keys are: if
	// the engine knows no more objects, the new ones counted, than came,
	// none was removed.
	if len(e.seen) > distinct {
		for id, s := range e.seen {
			if s.cycle != e.cycle {
				delete(e.seen, id)
				c.removed = append(c.removed, s.key)
				c.kinds[id.kind] = true
			}
		}
	}
	c.meshes = c.kindHash("Mesh", e.meshes)
	c.grants = c.kindHash("KubernetesCluster", e.grants)
	return c
}

// versions records the key and version of every object of list (and, when
// byKey is set, the object by its key), and which are new or changed; it
// returns how many objects of list the engine had not yet seen this cycle.
// spec is read only for an object without a UID and generation.
func versions[T any](e *Engine, c *cycle, list []T, kind string, meta func(*T) *metav1.ObjectMeta, spec func(*T) any, byKey map[string]*T) int {
	keys := make([]string, 0, len(list))
	fresh := 0
	for i := range list {
		m := meta(&list[i])
		id := objID{kind, m.Namespace, m.Name}
		s := e.seen[id]
		if s == nil {
			s = &seenObject{key: objectKey(kind, m.Namespace, m.Name)}
			e.seen[id] = s
		}
		if s.ver == "" || m.UID == "" || m.Generation <= 0 || s.uid != m.UID || s.gen != m.Generation {
			last := s.ver // "" for an object the engine did not know
			s.uid, s.gen = m.UID, m.Generation
			s.ver = version(m, func() any { return spec(&list[i]) })
			if s.ver != last {
				c.changed[s.key] = true
				c.kinds[kind] = true
			}
		}
		if s.cycle != e.cycle {
			s.cycle = e.cycle
			fresh++
		}
		c.vers[s.key] = s.ver
		keys = append(keys, s.key)
		if byKey != nil {
			byKey[s.key] = &list[i]
		}
	}
	c.keys[kind] = keys
	return fresh
}

// kindHash is the hash of the keys and versions of every object of kind:
// last, the last cycle's, when none of them changed, was added or removed.
func (c *cycle) kindHash(kind, last string) string {
	if last != "" && !c.kinds[kind] {
		return last
	}
	h := sha256.New()
	writeVersions(h, c, kind)
	return hex.EncodeToString(h.Sum(nil))
}

// sortedKeys returns the keys of every object of kind, sorted.
func (c *cycle) sortedKeys(kind string) []string {
	keys := c.keys[kind]
	if !c.sorted[kind] {
		slices.Sort(keys)
		c.sorted[kind] = true
	}
	return keys
}

// writeKV hashes one key and value.
func writeKV(h hash.Hash, k, v string) {
	io.WriteString(h, k)
	h.Write([]byte{'='})
	io.WriteString(h, v)
	h.Write([]byte{0})
}

// writeVersions hashes the keys and versions of every object of kind, in
// key order.
func writeVersions(h hash.Hash, c *cycle, kind string) {
	for _, k := range c.sortedKeys(kind) {
		writeKV(h, k, c.vers[k])
	}
}

// Translate translates in, recomputing only what changed since the last
// call, and returns the report. Dirty and ClusterObjects give the outputs.
func (e *Engine) Translate(in *translation.Input) *translation.Report {
	c := e.newCycle(in)
	e.updateIndexes(c)
	e.meshes, e.grants = c.meshes, c.grants

	report := translation.NewReport()
	invalid := e.scope(c, report)

	next := map[string]*unit{}
	recomputed := 0
	run := func(key, deps string, compute func() *unit) *unit {
		if u := e.units[key]; u != nil && u.deps == deps {
			next[key] = u
			return u
		}
		u := compute()
		u.deps = deps
		next[key] = u
		recomputed++
		return u
	}

	// Federation.
	plan := federation.NewPlan(in)
	sorted := translation.SortedDestinations(in.Destinations)
	var notes []federation.Note
	vmUnits := map[translation.ObjectKey][]*unit{}
	for _, d := range sorted {
		deps := plan.ExportDeps(d)
		if deps == "" {
			continue
		}
		k := objectKey("Destination", d.Namespace, d.Name)
		u := run("fed/"+k, deps+"/"+c.vers[k], func() *unit {
			out := translation.NewOutput()
			n := plan.Export(d, out)
			return &unit{objects: objectsOf(out), notes: n}
		})
		notes = append(notes, u.notes...)
		vm := plan.VirtualMeshOf(d)
		vk := translation.ObjectKey{Kind: "VirtualMesh", Namespace: vm.Namespace, Name: vm.Name}
		vmUnits[vk] = append(vmUnits[vk], u)
	}
	h := sha256.New()
	writeVersions(h, c, "VirtualMesh")
	fmt.Fprintf(h, "%s\x00%s\x00", c.meshes, c.grants)
	for _, n := range notes {
		fmt.Fprintf(h, "%s\x00%s\x00%t\x00%s\x00%s\x00", n.VirtualMesh, n.Mesh, n.Exported, n.Error, n.AmbientPeer)
	}
	finish := run("fed-finish", hex.EncodeToString(h.Sum(nil)), func() *unit {
		out, r := translation.NewOutput(), translation.NewReport()
		plan.Finish(notes, out, r)
		return &unit{objects: objectsOf(out), report: r}
	})

	// VirtualDestinations.
	if len(in.VirtualDestinations) > 0 {
		h := sha256.New()
		// Workloads: on a flat network a backend's identities are the
		// service accounts of the Workloads it selects. AccessPolicies:
		// ambient backends must be selected by the same ones.
		for _, kind := range []string{"VirtualDestination", "VirtualMesh", "Mesh", "Destination", "Workload", "AccessPolicy"} {
			writeVersions(h, c, kind)
		}
		run("vd", hex.EncodeToString(h.Sum(nil)), func() *unit {
			// The AccessPolicies TranslateAccess is given (scoped): what
			// ambient backends must share, and the rules a hostname takes.
			vdIn := *in
			vdIn.AccessPolicies = nil
			for _, p := range in.AccessPolicies {
				if !invalid[objectKey("AccessPolicy", p.Namespace, p.Name)] {
					vdIn.AccessPolicies = append(vdIn.AccessPolicies, p)
				}
			}
			out, r := translation.NewOutput(), translation.NewReport()
			hostnames := federation.TranslateVirtualDestinationsHostnames(&vdIn, out, r)
			policy.TranslateHostnameAccess(&vdIn, hostnames, out, r)
			return &unit{objects: objectsOf(out), report: r}
		})
	}

	e.trafficUnits(c, invalid, run)
	e.accessUnits(c, invalid, run)

	// Keep the last good outputs of a VirtualMesh that turned Invalid.
	kept := e.keepLastGood(c, finish, vmUnits, next)

	units := next
	if collision := e.apply(units); collision != "" {
		return e.full(in, collision)
	}
	for _, k := range slices.Sorted(maps.Keys(units)) {
		if r := units[k].report; r != nil {
			report.Merge(r)
		}
	}
	report.WarnUntargeted("TrafficPolicy", "AccessPolicy")
	for _, vk := range slices.SortedFunc(maps.Keys(kept), compareKeys) {
		report.Warn(vk, kept[vk].generation, "%s", keptWarning(kept[vk].generation))
	}
	e.report = report
	e.stats = Stats{Units: len(units), Recomputed: recomputed}
	return report
}

func keptWarning(gen int64) string {
	return fmt.Sprintf("its meshes keep the outputs of generation %d, the last valid one, until the VirtualMesh is valid again or deleted", gen)
}

func compareKeys(a, b translation.ObjectKey) int {
	return strings.Compare(a.Kind+"/"+a.Namespace+"/"+a.Name, b.Kind+"/"+b.Namespace+"/"+b.Name)
}

// full translates everything (Translate) and replaces the engine's state
// with the result.
func (e *Engine) full(in *translation.Input, why string) *translation.Report {
	out, report := all.Translate(in, e.admin)
	for c := range e.clusters {
		e.dirty[c] = true
	}
	for _, u := range e.units {
		e.drop(u)
	}
	e.reset()
	u := &unit{objects: objectsOf(out), deps: "full"}
	e.units = map[string]*unit{"full": u}
	for _, p := range u.objects {
		p.unit = "full"
		e.put(p)
	}
	if err := e.settle(); err != "" {
		// Cannot happen: a full translation produces one object per key.
		why += "; " + err
	}
	for c := range e.clusters {
		e.dirty[c] = true
	}
	// Remembering no versions makes the next translation recompute every
	// unit, which replaces this one.
	e.report = report
	e.stats = Stats{Units: 1, Recomputed: 1, Full: true, FullReason: why}
	return report
}

// objectsOf encodes an output's objects for publishing.
func objectsOf(out *translation.Output) []*published {
	objs := out.Objects()
	ps := make([]*published, 0, len(objs))
	for _, o := range objs {
		b, err := fastjson.Marshal(o.Object.Object)
		if err != nil {
			continue // cannot happen: an object is made of what JSON decodes to
		}
		parents := make([]string, len(o.Parents))
		for i, p := range o.Parents {
			parents[i] = p.String()
		}
		u := o.Object
		ps = append(ps, &published{cluster: o.Cluster, key: strings.Join([]string{u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName()}, "/"),
			parents: o.Parents, wire: &relaypb.OutputObject{Manifest: b, Parents: parents}})
	}
	return ps
}

// slot is one object key in one cluster: what each unit contributes, and
// what is published (one contribution, or several DestinationRules merged by
// translation.MergeSpecs, as Output.Add merges them in a full translation).
type slot struct {
	contribs map[string]*published // by unit key
	eff      *published
}

// apply replaces the contributions of every unit that changed and resolves
// the slots they touched. It returns a description of the first object that
// current units produce differently and cannot be merged.
func (e *Engine) apply(next map[string]*unit) string {
	for k, u := range e.units {
		if next[k] != u {
			e.drop(u)
		}
	}
	old := e.units
	e.units = next
	for k, u := range next {
		if old[k] == u {
			continue
		}
		for _, p := range u.objects {
			p.unit = k
			e.put(p)
		}
	}
	return e.settle()
}

func (e *Engine) slot(cluster, key string, create bool) *slot {
	objs := e.clusters[cluster]
	if objs == nil {
		if !create {
			return nil
		}
		objs = map[string]*slot{}
		e.clusters[cluster] = objs
	}
	sl := objs[key]
	if sl == nil && create {
		sl = &slot{contribs: map[string]*published{}}
		objs[key] = sl
	}
	if sl != nil {
		if e.touched[cluster] == nil {
			e.touched[cluster] = map[string]*published{}
		}
		if _, seen := e.touched[cluster][key]; !seen {
			e.touched[cluster][key] = sl.eff
		}
	}
	return sl
}

func (e *Engine) put(p *published) {
	e.slot(p.cluster, p.key, true).contribs[p.unit] = p
}

func (e *Engine) drop(u *unit) {
	for _, p := range u.objects {
		if sl := e.slot(p.cluster, p.key, false); sl != nil && sl.contribs[p.unit] == p {
			delete(sl.contribs, p.unit)
		}
	}
}

// settle decides what every touched slot publishes and marks the clusters
// whose published objects changed dirty.
func (e *Engine) settle() string {
	defer func() { e.touched = map[string]map[string]*published{} }()
	for _, c := range slices.Sorted(maps.Keys(e.touched)) {
		for _, k := range slices.Sorted(maps.Keys(e.touched[c])) {
			was := e.touched[c][k]
			sl := e.clusters[c][k]
			if err := e.resolve(sl); err != nil {
				return fmt.Sprintf("%s in cluster %s: %v", k, c, err)
			}
			if sl.eff == nil {
				delete(e.clusters[c], k)
			}
			if (was == nil) != (sl.eff == nil) || (was != nil && !samePublished(was, sl.eff)) {
				e.dirty[c] = true
			}
		}
	}
	return ""
}

// resolve sets what a slot publishes: its current units' contributions
// (merged when there are several), else a kept one.
func (e *Engine) resolve(sl *slot) error {
	var current, kept []*published
	for _, k := range slices.Sorted(maps.Keys(sl.contribs)) {
		if u := e.units[k]; u != nil && u.kept {
			kept = append(kept, sl.contribs[k])
		} else {
			current = append(current, sl.contribs[k])
		}
	}
	switch {
	case len(current) == 0 && len(kept) == 0:
		sl.eff = nil
	case len(current) == 0:
		sl.eff = kept[0]
	case len(current) == 1:
		sl.eff = current[0]
	default:
		merged, err := mergePublished(current)
		if err != nil {
			return err
		}
		sl.eff = merged
	}
	return nil
}

// mergePublished merges several units' versions of one object the way
// translation.Output.Add does.
func mergePublished(ps []*published) (*published, error) {
	var (
		obj     *unstructured.Unstructured
		parents []translation.Parent
	)
	for _, p := range ps {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(p.wire.Manifest); err != nil {
			return nil, err
		}
		parents = append(parents, p.parents...)
		if obj == nil {
			obj = u
			continue
		}
		if !translation.SameMetadata(obj, u) {
			return nil, errors.New("produced twice with different labels or annotations")
		}
		a, _ := obj.Object["spec"].(map[string]any)
		b, _ := u.Object["spec"].(map[string]any)
		spec, err := translation.MergeSpecs(obj.GetKind(), a, b)
		if err != nil {
			return nil, err
		}
		obj.Object["spec"] = spec
	}
	slices.SortFunc(parents, func(a, b translation.Parent) int { return strings.Compare(a.String(), b.String()) })
	parents = slices.Compact(parents)
	names := make([]string, len(parents))
	for i, p := range parents {
		names[i] = p.String()
	}
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[outputs.ParentsAnnotation] = strings.Join(names, ",")
	obj.SetAnnotations(annotations)
	b, err := fastjson.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	return &published{unit: "merged", cluster: ps[0].cluster, key: ps[0].key, parents: parents,
		wire: &relaypb.OutputObject{Manifest: b, Parents: names}}, nil
}

func samePublished(a, b *published) bool {
	return string(a.wire.Manifest) == string(b.wire.Manifest) && slices.Equal(a.wire.Parents, b.wire.Parents)
}

// keepLastGood remembers, for every valid VirtualMesh, the units that make
// its outputs, and for every VirtualMesh that exists but is Invalid now adds
// a kept unit with the outputs it had when it was last valid. It returns the
// kept VirtualMeshes.
func (e *Engine) keepLastGood(c *cycle, finish *unit, vmUnits map[translation.ObjectKey][]*unit, next map[string]*unit) map[translation.ObjectKey]*keptVirtualMesh {
	kept := map[translation.ObjectKey]*keptVirtualMesh{}
	for i := range c.in.VirtualMeshes {
		vm := &c.in.VirtualMeshes[i]
		vk := translation.ObjectKey{Kind: "VirtualMesh", Namespace: vm.Namespace, Name: vm.Name}
		st, _, _ := finish.report.Status(vk)
		if st.State != common.StateInvalid {
			prev := e.lastGood[vk]
			if prev != nil && prev.generation == vm.Generation && prev.finishUnit == finish && slices.Equal(prev.units, vmUnits[vk]) {
				continue
			}
			lg := &keptVirtualMesh{generation: vm.Generation, units: vmUnits[vk], finishUnit: finish}
			if prev != nil {
				lg.serial = prev.serial + 1
			}
			parent := translation.Parent{Kind: "VirtualMesh", Namespace: vm.Namespace, Name: vm.Name}
			for _, p := range finish.objects {
				if slices.Contains(p.parents, parent) {
					lg.finish = append(lg.finish, p)
				}
			}
			e.lastGood[vk] = lg
			continue
		}
		lg := e.lastGood[vk]
		if lg == nil {
			continue
		}
		kept[vk] = lg
		key := "kept/" + vk.Namespace + "/" + vk.Name
		deps := fmt.Sprintf("%d", lg.serial)
		if u := e.units[key]; u != nil && u.deps == deps {
			next[key] = u
			continue
		}
		u := &unit{deps: deps, kept: true}
		for _, src := range lg.units {
			for _, p := range src.objects {
				cp := *p
				u.objects = append(u.objects, &cp)
			}
		}
		for _, p := range lg.finish {
			cp := *p
			u.objects = append(u.objects, &cp)
		}
		next[key] = u
	}
	// A deleted VirtualMesh keeps nothing.
	for vk := range e.lastGood {
		if !slices.ContainsFunc(c.in.VirtualMeshes, func(v networkingv1alpha1.VirtualMesh) bool {
			return v.Namespace == vk.Namespace && v.Name == vk.Name
		}) {
			delete(e.lastGood, vk)
		}
	}
	return kept
}
