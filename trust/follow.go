package trust

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// Several server replicas run a Controller each; one of them leads
// (Config.Leading). Only the leader writes VirtualMesh status, creates
// generated roots, removes steering annotations and drives rotations. Every
// other replica follows: on every reconcile it takes each VirtualMesh's
// state from the status the leader wrote (what a restarted server does
// once), so it publishes the trust requests and signs the intermediates the
// leader does, one watch event later.
//
// The leader's status writes are conditional on the resourceVersion its
// state was read from or last written as. A write refused as a conflict
// (the status moved since: a new leader's first write on a lagging watch, a
// deposed leader's late write, or a user's edit) marks the VirtualMesh
// stale; the next reconcile reads it afresh from the apiserver and goes on
// from there. So no write can move a rotation back, or skip a step, over
// one it did not see.

// staleRetry is how soon a failed fresh read of a VirtualMesh is tried
// again.
const staleRetry = 2 * time.Second

// errNotLeading refuses a status write on a replica that does not lead.
var errNotLeading = errors.New("not the leading replica")

// leading reports whether this replica runs the once-only work now.
func (c *Controller) leading() bool {
	return c.cfg.Leading == nil || c.cfg.Leading()
}

// observeLeadership returns whether this replica leads, and at the start of
// a term makes every state it followed be read afresh before the first
// write, and forgets what it wrote in an earlier term.
func (c *Controller) observeLeadership() bool {
	leading := c.leading()
	c.mu.Lock()
	defer c.mu.Unlock()
	if leading && !c.led {
		for key := range c.vmst {
			c.stale[key] = true
		}
		clear(c.written)
		clear(c.grantWritten)
	}
	c.led = leading
	return leading
}

// follow brings key's state up to date with vm's status where memory is not
// to be trusted: always on a follower (unless vm is older than a write this
// replica made itself), and on the leader when nothing is known yet or the
// state is stale (read afresh then). It returns the VirtualMesh to plan with.
func (c *Controller) follow(ctx context.Context, key string, vm *networkingv1alpha1.VirtualMesh, leading bool) *networkingv1alpha1.VirtualMesh {
	c.mu.Lock()
	_, known := c.vmst[key]
	stale := c.stale[key]
	older := c.replaced[key][vm.ResourceVersion]
	c.mu.Unlock()
	switch {
	case !leading && older:
		// The watch has not shown this replica's own last write yet (it
		// led until a moment ago): memory is newer.
	case !leading, !known:
		c.adopt(key, vm)
	case stale:
		fresh, err := c.read(ctx, vm.Namespace, vm.Name)
		if err != nil {
			// Still stale: writes stay refused until a read succeeds; try
			// again soon rather than at the next event.
			c.log.Warn("could not read the VirtualMesh afresh; not writing its status yet", "virtual_mesh", key, "error", err, "retry_in", staleRetry)
			time.AfterFunc(staleRetry, c.Kick)
			return vm
		}
		c.adopt(key, fresh)
		return fresh
	}
	return vm
}

// read gets a VirtualMesh from the apiserver, not the watch.
func (c *Controller) read(ctx context.Context, namespace, name string) (*networkingv1alpha1.VirtualMesh, error) {
	u, err := c.cfg.Dynamic.Resource(networkingv1alpha1.VirtualMeshes).Namespace(namespace).
		Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var vm networkingv1alpha1.VirtualMesh
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vm); err != nil {
		return nil, fmt.Errorf("VirtualMesh %s/%s: %w", namespace, name, err)
	}
	return &vm, nil
}

// adopt makes the state vm's status records key's state, as of vm's
// resourceVersion. It is idempotent: adopting one object twice changes
// nothing the second time. Intermediates this replica signed that the
// status does not list yet are kept (a follower cannot write them; it does
// once it leads).
func (c *Controller) adopt(key string, vm *networkingv1alpha1.VirtualMesh) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.adoptLocked(key, vm)
}

func (c *Controller) adoptLocked(key string, vm *networkingv1alpha1.VirtualMesh) *vmState {
	st := recordedState(vm)
	c.vmst[key] = st
	c.rv[key] = vm.ResourceVersion
	delete(c.stale, key)
	delete(c.replaced, key)
	delete(c.written, key)
	if t := vm.Status.SharedTrust; t != nil && len(t.Meshes) > 0 {
		cur := c.status[key]
		if cur == nil {
			cur = &networkingv1alpha1.SharedTrustStatus{}
			c.status[key] = cur
		}
		cur.Meshes = mergeIssued(cur.Meshes, t.Meshes)
	}
	return st
}

// recordedState is the state vm's status records: empty when it records no
// root in force (a new VirtualMesh, or its status lost).
func recordedState(vm *networkingv1alpha1.VirtualMesh) *vmState {
	st := &vmState{}
	t := vm.Status.SharedTrust
	if t == nil || t.Root == nil || t.RootFingerprint == "" {
		return st
	}
	st.inForce, st.fp, st.subject, st.message = t.Root.DeepCopy(), t.RootFingerprint, t.RootSubject, t.Message
	if t.RootNotAfter != nil {
		st.notAfter = t.RootNotAfter.Time
	}
	st.rotation = vm.Status.Rotation.DeepCopy()
	for _, e := range t.Federation {
		st.federation = append(st.federation, *e.DeepCopy())
	}
	return st
}

// mergeIssued is the union of two lists of issued intermediates by mesh,
// the later issued of two for one mesh winning (recorded on a tie), sorted
// by mesh.
func mergeIssued(local, recorded []networkingv1alpha1.MeshCAStatus) []networkingv1alpha1.MeshCAStatus {
	out := slices.Clone(recorded)
	for _, l := range local {
		i := slices.IndexFunc(out, func(m networkingv1alpha1.MeshCAStatus) bool { return m.Mesh == l.Mesh })
		switch {
		case i < 0:
			out = append(out, l)
		case l.NotBefore.After(out[i].NotBefore.Time):
			out[i] = l
		}
	}
	slices.SortFunc(out, func(a, b networkingv1alpha1.MeshCAStatus) int { return strings.Compare(a.Mesh, b.Mesh) })
	return out
}

// conditional adds metadata.resourceVersion to an apply body, which makes
// the apiserver refuse it (409 Conflict) unless the object is still at rv.
func conditional(body []byte, rv string) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		return nil, errors.New("status body without metadata")
	}
	meta["resourceVersion"] = rv
	return json.Marshal(obj)
}

// resumeAfter takes obj, the answer to a write of key that changed no
// status, as the resourceVersion key's state is current at when its status
// records that state (root in force and rotation); otherwise the state is
// stale and read afresh before the next write.
func (c *Controller) resumeAfter(key string, obj *unstructured.Unstructured) {
	var vm networkingv1alpha1.VirtualMesh
	err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &vm)
	c.mu.Lock()
	defer c.mu.Unlock()
	st, rec := c.vmst[key], recordedState(&vm)
	if err == nil && st != nil && st.fp == rec.fp && sameJSON(st.inForce, rec.inForce) && sameJSON(st.rotation, rec.rotation) && sameJSON(st.federation, rec.federation) {
		c.rv[key] = vm.ResourceVersion
		return
	}
	c.stale[key] = true
}

// sameJSON compares a and b as the status stores them (times to the
// second).
func sameJSON(a, b any) bool {
	x, err := json.Marshal(a)
	if err != nil {
		return false
	}
	y, err := json.Marshal(b)
	return err == nil && string(x) == string(y)
}
