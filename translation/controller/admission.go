package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"

	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/translation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Admitter decides whether a user object may exist (policy/admission.Engine).
type Admitter interface {
	Decide(ctx context.Context, req admission.Request) (admission.Decision, error)
	Version() string
	Changed() <-chan struct{}
}

// InProcessUser is the user an in-process admission check is made for: the
// object is already stored, and who wrote it is not known.
const InProcessUser = "system:relaymesh:in-process-check"

var gvrNamespace = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// admitted is a cached in-process decision.
type admitted struct {
	fingerprint string // object UID, generation, namespace labels, rules version
	refusal     string // "" when allowed
}

// admit runs the admission check on every user object before translation,
// so that an object that reached the API some other way (webhook down,
// failurePolicy Ignore, created before a rule existed) is never translated:
// it is left out of the input and reported Invalid with the rule's message.
// A decision is made once per object generation, namespace labels and rule
// set version, so the audit log gets one record per change, not one per
// translation.
func (c *Controller) admit(ctx context.Context, in *translation.Input) (*translation.Input, *translation.Report) {
	r := translation.NewReport()
	if c.admission == nil {
		return in, r
	}
	seen := map[string]bool{}
	check := func(kind, namespace, name string, generation int64, gvr schema.GroupVersionResource) bool {
		key := kind + "/" + namespace + "/" + name
		seen[key] = true
		obj, ok := c.object(gvr, namespace, name)
		if !ok {
			// The input came from this cache, so this should not happen;
			// what cannot be judged is not translated.
			r.Invalid(translation.ObjectKey{Kind: kind, Namespace: namespace, Name: name}, generation, "%s",
				"not judged by admission (the object left the watch cache), so it is not translated")
			return false
		}
		labels := c.namespaceLabels(namespace)
		fp := admissionFingerprint(obj, labels, c.admission.Version())
		a, cached := c.admitted[key]
		if !cached || a.fingerprint != fp {
			a = admitted{fingerprint: fp}
			d, err := c.admission.Decide(ctx, admission.Request{Operation: admission.OperationCreate, Kind: kind, Namespace: namespace, Name: name,
				Object: obj.Object, User: admission.User{Username: InProcessUser}, NamespaceLabels: labels})
			switch {
			case err != nil:
				a.refusal = "the admission check failed, so it is not translated: " + err.Error()
			case !d.Allowed:
				a.refusal = "refused by admission, so it is not translated: " + d.Message()
			}
			c.admitted[key] = a
		}
		if a.refusal != "" {
			r.Invalid(translation.ObjectKey{Kind: kind, Namespace: namespace, Name: name}, generation, "%s", a.refusal)
			return false
		}
		return true
	}
	out := *in
	out.VirtualMeshes = filter(in.VirtualMeshes, func(i int) bool {
		v := &in.VirtualMeshes[i]
		return check("VirtualMesh", v.Namespace, v.Name, v.Generation, gvrVirtualMesh)
	})
	out.TrafficPolicies = filter(in.TrafficPolicies, func(i int) bool {
		v := &in.TrafficPolicies[i]
		return check("TrafficPolicy", v.Namespace, v.Name, v.Generation, gvrTraffic)
	})
	out.AccessPolicies = filter(in.AccessPolicies, func(i int) bool {
		v := &in.AccessPolicies[i]
		return check("AccessPolicy", v.Namespace, v.Name, v.Generation, gvrAccess)
	})
	out.VirtualDestinations = filter(in.VirtualDestinations, func(i int) bool {
		v := &in.VirtualDestinations[i]
		return check("VirtualDestination", v.Namespace, v.Name, v.Generation, gvrVirtualDest)
	})
	for k := range c.admitted {
		if !seen[k] {
			delete(c.admitted, k)
		}
	}
	return &out, r
}

func filter[T any](xs []T, keep func(i int) bool) []T {
	var out []T
	for i := range xs {
		if keep(i) {
			out = append(out, xs[i])
		}
	}
	return out
}

func (c *Controller) object(gvr schema.GroupVersionResource, namespace, name string) (*unstructured.Unstructured, bool) {
	o, ok, err := c.informers[gvr].GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	u, ok := o.(*unstructured.Unstructured)
	return u, ok
}

func (c *Controller) namespaceLabels(namespace string) map[string]string {
	inf := c.informers[gvrNamespace]
	if inf == nil {
		return nil
	}
	o, ok, err := inf.GetStore().GetByKey(namespace)
	if err != nil || !ok {
		return nil
	}
	if u, ok := o.(*unstructured.Unstructured); ok {
		return u.GetLabels()
	}
	return nil
}

func admissionFingerprint(obj *unstructured.Unstructured, labels map[string]string, version string) string {
	h := sha256.New()
	// Not the resourceVersion: status writes change it, and would make every
	// translation decide (and audit) again. Rules may read metadata
	// (annotations such as relaymesh.io/allow-all), which generation does
	// not cover.
	fmt.Fprintf(h, "%s\x00%d\x00%s\x00", obj.GetUID(), obj.GetGeneration(), version)
	for _, m := range []map[string]string{obj.GetAnnotations(), obj.GetLabels(), labels} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(h, "%s=%s\x00", k, m[k])
		}
		h.Write([]byte{1})
	}
	return hex.EncodeToString(h.Sum(nil))
}
