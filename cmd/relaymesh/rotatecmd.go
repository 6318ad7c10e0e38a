package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

const rotateSynopsis = `start VIRTUALMESH: rotate a generated root: the server makes a new root and
  moves every mesh to it (MultiRoot: AddingNewRoot, PropagatingNewIntermediate,
  DeletingOldRoot, Finished; each phase once every mesh's agent acked the one
  before). A root in a Secret, an HSM or an external CA is rotated by pointing
  spec.mtls.shared.rootCA at the new one; after a rollback, start tries that
  root again.
continue VIRTUALMESH: with spec.mtls.rotationVerification Manual, let the
  rotation leave the phase it waits in (after you verified traffic), forward
  or, while it rolls back, to the next step back.
rollback VIRTUALMESH: walk the rotation back to the old root, one acked step
  at a time, from any phase (with Manual verification each step back waits
  for a continue, as the forward phases do).

VIRTUALMESH is NAMESPACE/NAME. With --wait the command prints each phase the
rotation passes through, and what each waits for (acks, SPIFFE federation
peers, a continue), until it finishes, is rolled back, waits for a continue,
or the time is up (then it fails).

With the SPIFFE bundle endpoint served (relaymesh server
--spiffe-bundle-listen), AddingNewRoot lasts at least three refresh hints plus
--spiffe-bundle-peer-poll after the new root is published (45m with the
defaults), so that every federated peer trusts the new root before anything
is issued from it.`

// rotateLong are the leaf commands' own descriptions.
var rotateLong = map[string]string{
	"start": `Rotate the shared root of VIRTUALMESH (NAMESPACE/NAME).

A generated root (spec.mtls.shared.rootCA.generated): the server makes a new
root and moves every mesh to it, phase by phase (MultiRoot: AddingNewRoot,
PropagatingNewIntermediate, DeletingOldRoot, Finished), each phase once every
mesh's agent acknowledged the one before, so no handshake between meshes
fails. spec.mtls.rotationStrategy says how: MultiRoot puts both roots in every
mesh's bundle; CrossSigned keeps one root in each bundle and has both roots
sign every intermediate while they change places (the phases keep their
names: step 1 adds the new root's signature, step 2 switches the bundles to
the new root, step 3 drops the old root's signature). A root in a Secret, an HSM or an external CA is rotated by pointing
spec.mtls.shared.rootCA at the new root (the server then rotates to it); after
such a rotation was rolled back, start tries that root again.

It refuses a VirtualMesh that is already rotating, and a MultiRoot rotation
of one whose meshes run ambient (ztunnel trusts a single root; the server
refuses it too, and holds a MultiRoot rotation in AddingNewRoot while any
member runs ambient): use CrossSigned there. With --wait it prints each phase until the rotation finishes,
rolls back, waits for a continue, or the time is up (then it fails).`,
	"continue": `Let the rotation of VIRTUALMESH (NAMESPACE/NAME) leave the phase it waits in.

With spec.mtls.rotationVerification Manual the server stops after each phase,
and after each step of a rollback, until you verified traffic and run this;
the command names the phase (and a rollback's step) and the new root it
continues, so a continue meant for an earlier phase or step is ignored.
It refuses a VirtualMesh that is not waiting for a continue. With --wait it
prints each phase until the rotation finishes, rolls back, waits for the
next continue, or the time is up (then it fails).`,
	"rollback": `Walk the rotation of VIRTUALMESH (NAMESPACE/NAME) back to the old root.

From any phase, one step at a time, each once every mesh's agent
acknowledged the one before, so no handshake between meshes fails on the way
back: the old root returns to every bundle first, then intermediates of the
old root, and the new root leaves the bundles last. With Manual verification
each step back waits for ` + "`relaymesh ca rotate continue`" + ` (verify that every
istiod and workload runs on it first), as the forward phases do. It refuses a VirtualMesh that is not rotating (or already rolling
back). With --wait it prints each phase until the rollback ends or the time
is up (then it fails).`,
}

func newCARotateCommand(d deps, g *globals) *cobra.Command {
	var subs []*cobra.Command
	for _, v := range []struct{ verb, short, example string }{
		{"start", "Rotate a VirtualMesh's shared root with no failed handshake between meshes",
			"  relaymesh ca rotate start relaymesh/bookinfo-federation --wait 2m"},
		{"continue", "Let a rotation with Manual verification leave the phase it waits in",
			"  relaymesh ca rotate continue relaymesh/bookinfo-federation --wait 2m"},
		{"rollback", "Walk a rotation back to the old root, one acknowledged step at a time",
			"  relaymesh ca rotate rollback relaymesh/bookinfo-federation --wait 5m"},
	} {
		var wait time.Duration
		c := &cobra.Command{
			Use:               v.verb + " NAMESPACE/VIRTUALMESH",
			Short:             v.short,
			Long:              rotateLong[v.verb],
			Example:           v.example,
			Args:              exactArgs(1, "exactly one NAMESPACE/VIRTUALMESH"),
			ValidArgsFunction: completeVirtualMeshes(g),
			RunE: func(c *cobra.Command, args []string) error {
				return rotate(c.Context(), d, g, v.verb, args[0], wait)
			},
		}
		c.Flags().DurationVar(&wait, "wait", 0, "print the phases until the rotation finishes, rolls back or waits for a continue; fail after this long (0: do not wait)")
		subs = append(subs, c)
	}
	return groupCommand("rotate", "Rotate a VirtualMesh's shared root: start, continue, rollback", rotateSynopsis,
		"  relaymesh ca rotate start relaymesh/bookinfo-federation --wait 2m", subs...)
}

func rotate(ctx context.Context, d deps, g *globals, verb, key string, wait time.Duration) error {
	stdout := d.stdout
	ns, name, ok := strings.Cut(key, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return usagef("want exactly one NAMESPACE/VIRTUALMESH, got %q", key)
	}
	if wait < 0 {
		return usagef("--wait must not be negative")
	}
	kube, err := g.clients()
	if err != nil {
		return err
	}
	vms := kube.Dynamic.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns)
	rot, annotation, value, err := annotateRotation(ctx, kube, g, vms, name, key, verb)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s=%s\n", key, annotation, value)
	if wait == 0 {
		return nil
	}
	return watchRotation(ctx, vms, name, rot, wait, stdout)
}

// ambientMeshes are the members of vm that run ambient, as discovered in
// namespace (the server's). Meshes that cannot be read are not counted:
// the server refuses the rotation anyway (its status says why).
func ambientMeshes(ctx context.Context, kube *kubeclient.Clients, namespace string, vm *networkingv1alpha1.VirtualMesh) []string {
	list, err := kube.Dynamic.Resource(discoveryv1alpha1.Meshes).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	in := &translation.Input{}
	for _, u := range list.Items {
		var m discoveryv1alpha1.Mesh
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &m) == nil {
			in.Meshes = append(in.Meshes, m)
		}
	}
	var members []*discoveryv1alpha1.Mesh
	for _, ref := range vm.Spec.Meshes {
		if m, err := in.MeshFor(ref); err == nil {
			members = append(members, m)
		}
	}
	return trust.AmbientMembers(members)
}

// watchRotation prints the rotation's phases until it settles: finished,
// rolled back, failed, or waiting for a continue. It watches the
// VirtualMesh, so every phase the server records is seen, however short.
func watchRotation(ctx context.Context, vms dynamic.ResourceInterface, name string, before *networkingv1alpha1.RotationStatus, wait time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	last := ""
	// show prints rot if it is new, and reports whether it settled.
	show := func(rot *networkingv1alpha1.RotationStatus) (bool, error) {
		if rot == nil || sameRotationState(rot, before) {
			return false, nil
		}
		line := fmt.Sprintf("%s step %d", rot.Phase, rot.Step)
		if rot.AwaitingContinue {
			line += " (awaiting continue)"
		}
		// A step's message says what it waits for (acks, federated
		// peers, a continue): each new one is shown.
		if line+rot.Message != last {
			fmt.Fprintf(out, "%s  %-45s %s\n", time.Now().UTC().Format(time.TimeOnly), line, rot.Message)
			last = line + rot.Message
		}
		switch {
		case rot.Phase == networkingv1alpha1.PhaseFailed:
			return true, errors.New(rot.Message)
		case !trust.Rotating(rot.Phase) || rot.AwaitingContinue:
			return true, nil
		}
		return false, nil
	}
	for ctx.Err() == nil {
		vm, rv, err := getVirtualMesh(ctx, vms, name)
		if err != nil {
			return err
		}
		if done, err := show(vm.Status.Rotation); done {
			return err
		}
		w, err := vms.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: rv})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				break // an error event: start over from a Get
			}
			var vm networkingv1alpha1.VirtualMesh
			if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vm) != nil {
				continue
			}
			if done, err := show(vm.Status.Rotation); done {
				w.Stop()
				return err
			}
		}
		w.Stop()
	}
	return fmt.Errorf("the rotation did not settle within the --wait time (last: %s)", cmp.Or(last, "no change seen"))
}

// sameRotationState reports whether rot is still what it was before the
// command acted (so nothing has happened yet).
func sameRotationState(rot, before *networkingv1alpha1.RotationStatus) bool {
	return before != nil && rot.Phase == before.Phase && rot.Step == before.Step &&
		rot.AwaitingContinue == before.AwaitingContinue && rot.NewRootFingerprint == before.NewRootFingerprint
}

func getVirtualMesh(ctx context.Context, vms dynamic.ResourceInterface, name string) (*networkingv1alpha1.VirtualMesh, string, error) {
	u, err := vms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	var vm networkingv1alpha1.VirtualMesh
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vm); err != nil {
		return nil, "", fmt.Errorf("VirtualMesh %s: %w", name, err)
	}
	return &vm, u.GetResourceVersion(), nil
}

func phaseOrNone(rot *networkingv1alpha1.RotationStatus) string {
	if rot == nil {
		return string(networkingv1alpha1.PhaseNotRotating)
	}
	return string(rot.Phase)
}

// rotationLine describes a rotation for `ca status`.
func rotationLine(rot *networkingv1alpha1.RotationStatus) string {
	s := fmt.Sprintf("  rotation (%s): %s step %d, %s… → %s…", trust.StrategyOf(rot), rot.Phase, rot.Step, trust.ShortFingerprint(rot.OldRootFingerprint), trust.ShortFingerprint(rot.NewRootFingerprint))
	if rot.AwaitingContinue {
		s += ", awaiting `relaymesh ca rotate continue`"
	}
	if len(rot.PendingMeshes) > 0 {
		s += ", waiting for " + strings.Join(rot.PendingMeshes, ", ")
	}
	return s + "\n  " + rot.Message
}

// annotateRotation writes the annotation verb asks for. The decision is
// made on what was read, and the annotation is written only onto that
// resourceVersion. A conflict (most often a status write of the server's)
// decides again on what the VirtualMesh is now, after client-go's short
// conflict backoff, and writes only the same decision: a continue meant
// for one phase never continues the next.
func annotateRotation(ctx context.Context, kube *kubeclient.Clients, g *globals, vms dynamic.ResourceInterface, name, key, verb string) (rot *networkingv1alpha1.RotationStatus, annotation, value string, err error) {
	first := ""
	backoff := retry.DefaultRetry
	backoff.Steps = maxRotationAttempts
	err = retry.RetryOnConflict(backoff, func() error {
		var err error
		rot, annotation, value, err = requestRotation(ctx, kube, g, vms, name, key, verb, first)
		if first == "" && annotation != "" {
			first = annotation + "=" + value
		}
		return err
	})
	return rot, annotation, value, err
}

// maxRotationAttempts bounds the attempts of annotateRotation.
const maxRotationAttempts = 5

// requestRotation reads the VirtualMesh, decides the annotation verb asks
// for, and writes it onto the resourceVersion it read. decided, if not
// empty, is the decision of an earlier attempt ("annotation=value"): a
// different one now is refused, nothing written.
func requestRotation(ctx context.Context, kube *kubeclient.Clients, g *globals, vms dynamic.ResourceInterface, name, key, verb, decided string) (rot *networkingv1alpha1.RotationStatus, annotation, value string, err error) {
	vm, rv, err := getVirtualMesh(ctx, vms, name)
	if err != nil {
		return nil, "", "", err
	}
	if vm.Spec.MTLS == nil || vm.Spec.MTLS.Shared == nil {
		return nil, "", "", fmt.Errorf("VirtualMesh %s has no shared trust (spec.mtls.shared): there is no root to rotate", key)
	}
	rot = vm.Status.Rotation
	rotating := rot != nil && trust.Rotating(rot.Phase)
	switch verb {
	case "start":
		var ambient []string
		if !rotating && cmp.Or(vm.Spec.MTLS.RotationStrategy, networkingv1alpha1.RotationMultiRoot) == networkingv1alpha1.RotationMultiRoot {
			ambient = ambientMeshes(ctx, kube, g.namespace, vm)
		}
		switch {
		case rotating:
			return nil, "", "", fmt.Errorf("%s is already rotating (%s): continue or roll it back first", key, rot.Phase)
		case len(ambient) > 0:
			return nil, "", "", fmt.Errorf("%s: %s", key, trust.AmbientRefusal(ambient))
		case vm.Spec.MTLS.Shared.RootCA.Generated != nil:
			gen, _ := strconv.Atoi(vm.Annotations[networkingv1alpha1.AnnotationRootGeneration])
			annotation, value = networkingv1alpha1.AnnotationRootGeneration, strconv.Itoa(max(gen, 1)+1)
		case rot != nil && rot.Phase == networkingv1alpha1.PhaseRolledBack:
			// Try again the root the last rotation was rolled back from.
			annotation, value = networkingv1alpha1.AnnotationRotationRetry, rot.NewRootFingerprint
		default:
			return nil, "", "", fmt.Errorf("the root of %s is not generated: point spec.mtls.shared.rootCA at the new root (a new Secret, HSM key or CA service) and the server rotates to it", key)
		}
	case "continue":
		if !rotating {
			return nil, "", "", fmt.Errorf("%s has no rotation that can continue (%s)", key, phaseOrNone(rot))
		}
		if !rot.AwaitingContinue {
			return nil, "", "", fmt.Errorf("%s is in %s and not waiting for a continue: %s", key, rot.Phase, rot.Message)
		}
		annotation, value = networkingv1alpha1.AnnotationRotationContinue, trust.ContinueValue(rot)
	case "rollback":
		if !rotating || rot.Phase == networkingv1alpha1.PhaseRollingBack {
			return nil, "", "", fmt.Errorf("%s has no rotation to roll back (%s)", key, phaseOrNone(rot))
		}
		annotation, value = networkingv1alpha1.AnnotationRotationRollback, rot.NewRootFingerprint
	}
	if decided != "" && decided != annotation+"="+value {
		return nil, "", "", fmt.Errorf("%s changed while the request was written (first %s, now %s): nothing written; check its rotation and run the command again", key, decided, annotation+"="+value)
	}
	// The resourceVersion makes this fail if the VirtualMesh changed since
	// it was read (e.g. the phase moved on).
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": rv, "annotations": map[string]string{annotation: value}}})
	if err != nil {
		return nil, "", "", err
	}
	if _, err := vms.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return rot, annotation, value, fmt.Errorf("annotate %s: %w", key, err)
	}
	return rot, annotation, value, nil
}
