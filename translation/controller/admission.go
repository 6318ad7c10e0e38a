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
	"github.com/relaymesh/relaymesh/translation/all"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Admitter decides whether a user object may exist (policy/admission.Engine).
type Admitter interface {
	Decide(ctx context.Context, req admission.Request) (admission.Decision, error)
	Version() string
	Changed() <-chan struct{}
}

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
	out := all.Judge(in, r, func(kind string, o metav1.Object, _ runtime.Object) string {
		namespace, name := o.GetNamespace(), o.GetName()
		key := kind + "/" + namespace + "/" + name
		seen[key] = true
		obj, ok := c.object(userKinds[kind], namespace, name)
		if !ok {
			// The input came from this cache, so this should not happen;
			// what cannot be judged is not translated.
			return "not judged by admission (the object left the watch cache), so it is not translated"
		}
		labels := c.namespaceLabels(namespace)
		fp := admissionFingerprint(obj, labels, c.admission.Version())
		a, cached := c.admitted[key]
		if !cached || a.fingerprint != fp {
			d, err := c.admission.Decide(ctx, admission.Request{Operation: admission.OperationCreate, Kind: kind, Namespace: namespace, Name: name,
				Object: obj.Object, User: admission.User{Username: all.InProcessUser}, NamespaceLabels: labels})
			a = admitted{fingerprint: fp, refusal: all.Refusal(d, err)}
			c.admitted[key] = a
		}
		return a.refusal
	})
	for k := range c.admitted {
		if !seen[k] {
			delete(c.admitted, k)
		}
	}
	return out, r
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
