package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaymesh/relaymesh/api/outputs"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/csaupgrade"
)

// maxAttempts bounds how often one object is re-read after it changed
// between the agent's read and its write.
const maxAttempts = 3

// listPageSize is the page size of the owned-object lists.
const listPageSize = 500

// kindState is one allowed kind as the cluster serves it.
type kindState struct {
	gvk      schema.GroupVersionKind
	resource dynamic.NamespaceableResourceInterface
	// owned holds the objects labelled with the agent's owner, listed before
	// the first write; nil when the kind could not be listed.
	owned map[objectKey]*unstructured.Unstructured
	// mapErr is set when the kind cannot be used at all (not served, or
	// cluster-scoped); err when it cannot be pruned (mapErr or a failed
	// list).
	mapErr, err error
	// optionalUnserved: an optional kind the cluster does not serve; no
	// object of it exists, so err is not reported for the set.
	optionalUnserved bool
}

// resetMapperIfStale forgets cached discovery after a kind was not found,
// so a CRD installed since is seen.
func (a *Applier) resetMapperIfStale() {
	now := time.Now()
	if !a.kindMissing && (!a.optionalMissing || now.Sub(a.lastReset) < optionalRediscovery) {
		return
	}
	if r, ok := a.cfg.Mapper.(meta.ResettableRESTMapper); ok {
		r.Reset()
	}
	a.kindMissing, a.optionalMissing, a.lastReset = false, false, now
}

// kinds maps every allowed kind and lists the objects the agent owns of it.
func (a *Applier) kinds(ctx context.Context) []*kindState {
	out := make([]*kindState, len(a.cfg.Kinds))
	for i, gvk := range a.cfg.Kinds {
		k := &kindState{gvk: gvk}
		out[i] = k
		m, err := a.cfg.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		switch {
		case err != nil:
			k.mapErr = fmt.Errorf("kind %s is not served by the cluster (is its CRD installed?): %w", kindString(gvk), err)
			k.optionalUnserved = a.optional[gvk] && meta.IsNoMatchError(err)
			if k.optionalUnserved {
				a.optionalMissing = true
			} else {
				a.kindMissing = true
			}
		case m.Scope.Name() != meta.RESTScopeNameNamespace:
			k.mapErr = fmt.Errorf("kind %s is cluster-scoped; the agent manages namespaced kinds only", kindString(gvk))
		default:
			k.resource = a.cfg.Dynamic.Resource(m.Resource)
		}
		if k.mapErr != nil {
			k.err = fmt.Errorf("%w; owned objects of this kind were not pruned", k.mapErr)
		}
	}
	parallel(len(out), func(i int) {
		k := out[i]
		if k.mapErr != nil {
			return
		}
		owned, err := a.listOwned(ctx, k)
		if err != nil {
			k.err = fmt.Errorf("listing owned objects of kind %s failed, none were pruned: %w", kindString(k.gvk), err)
			return
		}
		k.owned = owned
	})
	return out
}

// listOwned lists, in every namespace, the objects of k that carry the
// agent's owner label. It returns all of them or an error.
func (a *Applier) listOwned(ctx context.Context, k *kindState) (map[objectKey]*unstructured.Unstructured, error) {
	sel := labels.SelectorFromSet(labels.Set{outputs.OwnerLabel: a.cfg.Owner}).String()
	owned := map[objectKey]*unstructured.Unstructured{}
	opts := metav1.ListOptions{LabelSelector: sel, Limit: listPageSize}
	for {
		list, err := k.resource.List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			o := &list.Items[i]
			if o.GetLabels()[outputs.OwnerLabel] != a.cfg.Owner {
				continue // never trust a selector for a delete
			}
			owned[objectKey{group: k.gvk.Group, kind: k.gvk.Kind, namespace: o.GetNamespace(), name: o.GetName()}] = o
		}
		if list.GetContinue() == "" {
			return owned, nil
		}
		opts.Continue = list.GetContinue()
	}
}

// applyObject makes one valid object of the set exist as it should and
// returns its outcome and error text.
func (a *Applier) applyObject(ctx context.Context, k *kindState, it *item) (outcome, errText string) {
	if k.mapErr != nil {
		return OutcomeError, k.mapErr.Error()
	}
	ri := k.resource.Namespace(it.namespace)
	live, known := k.owned[it.key]
	for attempt := range maxAttempts {
		if !known || attempt > 0 {
			got, err := ri.Get(ctx, it.name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				live = nil
			case err != nil:
				return OutcomeError, fmt.Sprintf("read: %v", err)
			default:
				live = got
			}
		}
		if live == nil {
			outcome, errText, retry := a.create(ctx, ri, it)
			if retry {
				continue
			}
			return outcome, errText
		}
		if live.GetLabels()[outputs.OwnerLabel] != a.cfg.Owner {
			return OutcomeConflict, "exists and is not managed by relaymesh; left untouched"
		}
		if live.GetDeletionTimestamp() != nil {
			return OutcomeError, "the object is being deleted; a later set re-creates it"
		}
		outcome, errText, retry := a.update(ctx, ri, it, live)
		if retry {
			continue
		}
		return outcome, errText
	}
	return OutcomeError, fmt.Sprintf("the object changed during %d attempts to apply it; a later set retries", maxAttempts)
}

// create creates an object that did not exist. A plain create (not an
// apply) fails if the object appeared since it was read, so a user's object
// is never adopted. The create's field ownership is then turned into an
// apply's and the object applied once, so the agent owns exactly the fields
// a server-side apply would own and the next identical set is a no-op.
func (a *Applier) create(ctx context.Context, ri dynamic.ResourceInterface, it *item) (outcome, errText string, retry bool) {
	created, err := ri.Create(ctx, it.obj, metav1.CreateOptions{FieldManager: FieldManager, FieldValidation: metav1.FieldValidationStrict})
	if apierrors.IsAlreadyExists(err) {
		return "", "", true
	}
	if err != nil {
		return OutcomeError, fmt.Sprintf("create: %v", err), false
	}
	if outcome, errText, _ := a.update(ctx, ri, it, created); outcome == OutcomeError || outcome == "" {
		// The object is right; its field ownership is settled by the next set.
		a.log.Warn("created object not re-applied", "kind", it.kind, "namespace", it.namespace, "name", it.name, "error", errText)
	}
	return OutcomeApplied, "", false
}

// update server-side applies an object the agent owns, with the live
// object's UID and resourceVersion as preconditions: if the object changed
// since it was read (for instance lost its owner label) the write fails and
// the object is read again. The outcome is "unchanged" when nothing was
// written since that read; no request is sent when the live object already
// is exactly as the apply would leave it (see upToDate).
func (a *Applier) update(ctx context.Context, ri dynamic.ResourceInterface, it *item, live *unstructured.Unstructured) (outcome, errText string, retry bool) {
	if upToDate(it.obj, live) {
		return OutcomeUnchanged, "", false
	}
	before := live.GetResourceVersion()
	live, err := a.upgradeManagedFields(ctx, ri, live)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return "", "", true
	}
	if err != nil {
		return OutcomeError, fmt.Sprintf("convert field ownership: %v", err), false
	}
	body := it.obj.DeepCopy()
	body.SetUID(live.GetUID())
	body.SetResourceVersion(live.GetResourceVersion())
	data, err := json.Marshal(body.Object)
	if err != nil {
		return OutcomeError, fmt.Sprintf("encode: %v", err), false
	}
	out, err := ri.Patch(ctx, it.name, types.ApplyPatchType, data, metav1.PatchOptions{
		FieldManager: FieldManager, Force: new(true), FieldValidation: metav1.FieldValidationStrict,
	})
	if apierrors.IsConflict(err) {
		return "", "", true // precondition failed: read it again
	}
	if err != nil {
		return OutcomeError, fmt.Sprintf("apply: %v", err), false
	}
	if out.GetResourceVersion() == before {
		return OutcomeUnchanged, "", false
	}
	return OutcomeApplied, "", false
}

// upgradeManagedFields turns fields the agent owns through an update (its
// own create) into fields it owns through apply, so a field later dropped
// from the set is removed from the object. It returns obj unchanged when
// there is nothing to do.
func (a *Applier) upgradeManagedFields(ctx context.Context, ri dynamic.ResourceInterface, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(obj, sets.New(FieldManager), FieldManager)
	if err != nil || patch == nil {
		return obj, err
	}
	// The patch replaces resourceVersion, so it fails if obj changed.
	return ri.Patch(ctx, obj.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
}

// prune deletes the owned objects the set does not name, kind by kind, for
// every kind that could be listed.
func (a *Applier) prune(ctx context.Context, log *slog.Logger, kinds []*kindState, keep map[objectKey]bool) []*relaypb.ObjectResult {
	type candidate struct {
		k   *kindState
		obj *unstructured.Unstructured
	}
	var cands []candidate
	for _, k := range kinds {
		for key, o := range k.owned {
			if !keep[key] && o.GetDeletionTimestamp() == nil {
				cands = append(cands, candidate{k, o})
			}
		}
	}
	results := make([]*relaypb.ObjectResult, len(cands))
	parallel(len(cands), func(i int) {
		c := cands[i]
		r := a.pruneObject(ctx, c.k, c.obj)
		if r != nil {
			logResult(log, r)
		}
		results[i] = r
	})
	var out []*relaypb.ObjectResult
	for _, r := range results {
		if r != nil {
			out = append(out, r)
		}
	}
	return out
}

// pruneObject deletes one owned object with UID and resourceVersion
// preconditions, so only the object as listed (with the owner label) is
// deleted. If it changed, it is read again and deleted only if it still
// carries the label. It returns nil when there was nothing to delete.
func (a *Applier) pruneObject(ctx context.Context, k *kindState, obj *unstructured.Unstructured) *relaypb.ObjectResult {
	ri := k.resource.Namespace(obj.GetNamespace())
	r := &relaypb.ObjectResult{
		ApiVersion: k.gvk.GroupVersion().String(), Kind: k.gvk.Kind,
		Namespace: obj.GetNamespace(), Name: obj.GetName(),
	}
	uid := obj.GetUID()
	for attempt := range maxAttempts {
		if attempt > 0 {
			got, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				r.Outcome, r.Error = OutcomeError, fmt.Sprintf("prune: read: %v", err)
				return r
			}
			if got.GetUID() != uid || got.GetLabels()[outputs.OwnerLabel] != a.cfg.Owner || got.GetDeletionTimestamp() != nil {
				a.log.Info("not pruned: no longer the agent's object", "kind", k.gvk.Kind, "namespace", r.Namespace, "name", r.Name)
				return nil
			}
			obj = got
		}
		rv := obj.GetResourceVersion()
		err := ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case err == nil:
			r.Outcome = OutcomePruned
			return r
		case apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			r.Outcome, r.Error = OutcomeError, fmt.Sprintf("prune: %v", err)
			return r
		}
	}
	r.Outcome, r.Error = OutcomeError, fmt.Sprintf("prune: the object changed during %d attempts to delete it; a later set retries", maxAttempts)
	return r
}
