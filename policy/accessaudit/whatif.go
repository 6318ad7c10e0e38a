package accessaudit

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/relaymesh/relaymesh/translation"
)

// ErrNotFound means a what-if removal names an object that is not in the
// input.
var ErrNotFound = errors.New("not found")

// Ref names one input object.
type Ref struct{ Kind, Namespace, Name string }

func (r Ref) String() string { return r.Kind + "/" + r.Namespace + "/" + r.Name }

// Kinds of discovered objects (the user kinds are translation's).
const (
	KindMesh        = "Mesh"
	KindWorkload    = "Workload"
	KindDestination = "Destination"
)

// ParseRef parses KIND/NAMESPACE/NAME. The kind is any of the seven input
// kinds, in any case, singular, plural or short (ap, tp, vm, vd).
func ParseRef(s string) (Ref, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return Ref{}, fmt.Errorf("%q: want KIND/NAMESPACE/NAME, e.g. accesspolicy/bookinfo/reviews-from-productpage", s)
	}
	var kind string
	switch strings.ToLower(parts[0]) {
	case "mesh", "meshes":
		kind = KindMesh
	case "workload", "workloads":
		kind = KindWorkload
	case "destination", "destinations":
		kind = KindDestination
	default:
		k, err := translation.PolicyKind(parts[0])
		if err != nil {
			return Ref{}, fmt.Errorf("%q: %w (or mesh, workload, destination)", s, err)
		}
		kind = k
	}
	return Ref{Kind: kind, Namespace: parts[1], Name: parts[2]}, nil
}

// named is an input object: its namespace and name.
type named[T any] interface {
	*T
	GetNamespace() string
	GetName() string
}

// change returns base with the objects of with added (one with the kind,
// namespace and name of a base object replaces it, in place) and the objects
// of kind named in without removed; each removal found is marked in found.
func change[T any, P named[T]](kind string, base, with []T, without map[Ref]bool, found map[Ref]bool) []T {
	key := func(x *T) Ref { p := P(x); return Ref{Kind: kind, Namespace: p.GetNamespace(), Name: p.GetName()} }
	at := map[Ref]int{}
	out := make([]T, 0, len(base)+len(with))
	for i := range base {
		k := key(&base[i])
		if without[k] {
			found[k] = true
			continue
		}
		at[k] = len(out)
		out = append(out, base[i])
	}
	for i := range with {
		k := key(&with[i])
		if without[k] {
			found[k] = true
			continue
		}
		if j, ok := at[k]; ok {
			out[j] = with[i]
			continue
		}
		at[k] = len(out)
		out = append(out, with[i])
	}
	return out
}

// WhatIf returns the input a proposed change makes of base: every object of
// with is added, replacing the object of the same kind, namespace and name;
// every object without names is removed (from base and from with). base is
// not modified. Naming an object that is in neither is an error.
func WhatIf(base, with *translation.Input, without []Ref) (*translation.Input, error) {
	if with == nil {
		with = &translation.Input{}
	}
	rm := map[Ref]bool{}
	for _, r := range without {
		rm[r] = true
	}
	found := map[Ref]bool{}
	out := &translation.Input{
		Meshes:              change(KindMesh, base.Meshes, with.Meshes, rm, found),
		Workloads:           change(KindWorkload, base.Workloads, with.Workloads, rm, found),
		Destinations:        change(KindDestination, base.Destinations, with.Destinations, rm, found),
		VirtualMeshes:       change(translation.KindVirtualMesh, base.VirtualMeshes, with.VirtualMeshes, rm, found),
		TrafficPolicies:     change(translation.KindTrafficPolicy, base.TrafficPolicies, with.TrafficPolicies, rm, found),
		AccessPolicies:      change(translation.KindAccessPolicy, base.AccessPolicies, with.AccessPolicies, rm, found),
		VirtualDestinations: change(translation.KindVirtualDestination, base.VirtualDestinations, with.VirtualDestinations, rm, found),
		Clusters:            base.Clusters, // a proposed change cannot grant trust domains
	}
	var missing []error
	for _, r := range without {
		if !found[r] {
			missing = append(missing, fmt.Errorf("cannot remove %s: %w", r, ErrNotFound))
		}
	}
	return out, errors.Join(missing...)
}

// Diff is what a change does to access.
type Diff struct {
	Schema string `json:"schema"`
	// Input is what reading the files found (the view's, when read from
	// files, and the change's).
	Input *InputReport `json:"input,omitempty"`
	// Added, Removed and Changed pairs, each sorted by destination, port
	// and source.
	Added   []Pair   `json:"added"`
	Removed []Pair   `json:"removed"`
	Changed []Change `json:"changed"`
	// FindingsAdded are findings of the change that were not there before;
	// FindingsResolved the reverse. A finding whose message changes (say,
	// a count) is in both.
	FindingsAdded    []Finding `json:"findingsAdded"`
	FindingsResolved []Finding `json:"findingsResolved"`
}

// Change is a pair allowed before and after, differently: route, openness
// or grants (policies and their conditions).
type Change struct {
	Before Pair `json:"before"`
	After  Pair `json:"after"`
}

// Empty says whether the change changes nothing.
func (d *Diff) Empty() bool {
	return len(d.Added)+len(d.Removed)+len(d.Changed)+len(d.FindingsAdded)+len(d.FindingsResolved) == 0
}

func pairKey(p Pair) string {
	return p.Destination + "\x00" + strconv.Itoa(int(p.Port)) + "\x00" + p.Source
}

func comparePairs(x, y Pair) int {
	return cmp.Or(cmp.Compare(x.Destination, y.Destination), cmp.Compare(x.Port, y.Port), cmp.Compare(x.Source, y.Source))
}

func findingKey(f Finding) string {
	return f.Kind + "\x00" + strings.Join(f.Objects, "\x00") + "\x00" + f.Message
}

// Compare returns what changes from before to after.
func Compare(before, after *Result) *Diff {
	d := &Diff{Schema: Schema, Added: []Pair{}, Removed: []Pair{}, Changed: []Change{}, FindingsAdded: []Finding{}, FindingsResolved: []Finding{}}
	old := make(map[string]*Pair, len(before.Matrix.Pairs))
	for i := range before.Matrix.Pairs {
		old[pairKey(before.Matrix.Pairs[i])] = &before.Matrix.Pairs[i]
	}
	seen := make(map[string]bool, len(after.Matrix.Pairs))
	for _, p := range after.Matrix.Pairs {
		k := pairKey(p)
		seen[k] = true
		switch o, ok := old[k]; {
		case !ok:
			d.Added = append(d.Added, p)
		case !reflect.DeepEqual(*o, p):
			d.Changed = append(d.Changed, Change{Before: *o, After: p})
		}
	}
	for _, p := range before.Matrix.Pairs {
		if !seen[pairKey(p)] {
			d.Removed = append(d.Removed, p)
		}
	}
	slices.SortFunc(d.Added, comparePairs)
	slices.SortFunc(d.Removed, comparePairs)
	slices.SortFunc(d.Changed, func(x, y Change) int { return comparePairs(x.After, y.After) })

	oldF, newF := map[string]bool{}, map[string]bool{}
	for _, f := range before.Findings {
		oldF[findingKey(f)] = true
	}
	for _, f := range after.Findings {
		newF[findingKey(f)] = true
		if !oldF[findingKey(f)] {
			d.FindingsAdded = append(d.FindingsAdded, f)
		}
	}
	for _, f := range before.Findings {
		if !newF[findingKey(f)] {
			d.FindingsResolved = append(d.FindingsResolved, f)
		}
	}
	return d
}
