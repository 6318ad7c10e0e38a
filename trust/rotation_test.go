package trust_test

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// rotationWorld is a trust controller with the real server.Outputs and
// server.View, and one real trust.Agent per (simulated) workload cluster
// writing cacerts into its own namespace of a real kube-apiserver. sync is
// what the relay does: each agent applies its cluster's set and acks it.
type rotationWorld struct {
	t        testing.TB
	ctx      context.Context
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	ns       string
	clusters []string
	meshNS   map[string]string
	agents   map[string]*trust.Agent
	outputs  *server.Outputs
	view     *server.View
	ctl      *trust.Controller
	stop     context.CancelFunc
	modules  []string // PKCS#11 modules a VirtualMesh may name
	// verification is the VirtualMesh's spec.mtls.rotationVerification.
	verification string
	// strategy is its spec.mtls.rotationStrategy (empty: the default).
	strategy string
	// earlier are the clusters whose agents ack like an earlier release:
	// without the second root they hold (ObjectResult.cross_issuer).
	earlier map[string]bool
}

// applyVM applies the VirtualMesh "shared" with rootCA (YAML) and the
// world's meshes, plus extra mesh names.
func (w *rotationWorld) applyVM(rootCA string, extra ...string) {
	w.t.Helper()
	var names []string
	for _, cl := range w.clusters {
		names = append(names, "{clusterName: "+cl+", namespace: "+w.meshNS[cl]+", name: istiod}")
	}
	for _, m := range extra {
		// A registered cluster's mesh not discovered (yet): the VirtualMesh
		// is Invalid (a member of an unregistered cluster would only be
		// left out).
		names = append(names, "{clusterName: "+w.clusters[0]+", namespace: istio-system, name: "+m+"}")
	}
	meshes := strings.Join(names, ", ")
	_, err := env.Cluster("cluster-1").Apply(w.ctx, "test", []byte(fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shared, namespace: %s}
spec:
  meshes: [%s]
  mtls:
    rotationVerification: %s
    rotationStrategy: %s
    shared:
      rootCA: %s
`, w.ns, meshes, w.verification, cmp.Or(w.strategy, "MultiRoot"), rootCA)))
	require.NoError(w.t, err)
}

func newRotationWorld(t *testing.T, rootCA string, manual bool, modules ...string) *rotationWorld {
	t.Helper()
	return newRotationWorldOf(t, 2, rootCA, manual, modules...)
}

// newRotationWorldOf is newRotationWorld with n clusters of one mesh each.
func newRotationWorldOf(t testing.TB, n int, rootCA string, manual bool, modules ...string) *rotationWorld {
	t.Helper()
	w := setupRotationWorld(t, n, rootCA, manual, modules...)
	w.start()
	return w
}

// setupRotationWorld is newRotationWorldOf without a controller.
func setupRotationWorld(t testing.TB, n int, rootCA string, manual bool, modules ...string) *rotationWorld {
	t.Helper()
	w := &rotationWorld{t: t, ctx: context.Background(), kube: client(t),
		meshNS: map[string]string{}, agents: map[string]*trust.Agent{}, modules: modules}
	for i := range n {
		w.clusters = append(w.clusters, fmt.Sprintf("c%d", i+1))
	}
	w.ns = namespace(t, w.kube)
	var err error
	w.dyn, err = dynamic.NewForConfig(env.Cluster("cluster-1").RESTConfig())
	require.NoError(t, err)
	verification := "None"
	if manual {
		verification = "Manual"
	}
	manifest := ""
	for _, cl := range w.clusters {
		w.meshNS[cl] = w.ns + "-" + cl
		_, err := w.kube.CoreV1().Namespaces().Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.meshNS[cl]}}, metav1.CreateOptions{})
		require.NoError(t, err)
		w.agents[cl] = &trust.Agent{Client: w.kube, Owner: w.ns + "-agent-" + cl}
		manifest += fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: %[1]s, namespace: %[2]s}
spec: {}
---
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-%[1]s, namespace: %[2]s}
spec:
  istio:
    installation: {name: istiod, namespace: %[3]s, cluster: %[1]s}
    trustDomain: %[1]s.local
---
`, cl, w.ns, w.meshNS[cl])
	}
	_, err = env.Cluster("cluster-1").Apply(w.ctx, "test", []byte(manifest))
	require.NoError(t, err)
	w.verification = verification
	w.applyVM(rootCA)
	// Other tests' controllers watch VirtualMeshes everywhere.
	t.Cleanup(func() {
		_ = w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Delete(w.ctx, "shared", metav1.DeleteOptions{})
	})
	return w
}

// start starts a controller with empty outputs and acks, as a restarted
// server has.
func (w *rotationWorld) start(options ...func(*trust.Config)) {
	ctx, cancel := context.WithCancel(w.ctx)
	w.stop = cancel
	w.t.Cleanup(cancel)
	w.outputs, w.view = server.NewOutputs(time.Now()), server.NewView()
	cfg := trust.Config{Dynamic: w.dyn, Kube: w.kube, Namespace: w.ns, Outputs: w.outputs, Acks: w.view,
		Clusters: func() []string { return w.clusters }, Audit: audit.Discard, PKCS11Modules: w.modules}
	for _, o := range options {
		o(&cfg)
	}
	var err error
	w.ctl, err = trust.Start(ctx, cfg)
	require.NoError(w.t, err)
}

// sync lets every agent apply its cluster's current set and ack it.
func (w *rotationWorld) sync() {
	for _, cl := range w.clusters {
		set := w.outputs.Get(cl)
		if set == nil {
			continue
		}
		results, _ := w.agents[cl].Apply(w.ctx, set, func(ctx context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
			return w.ctl.SignIntermediate(ctx, cl, r)
		})
		if w.earlier[cl] {
			for _, r := range results {
				r.CrossIssuer = ""
			}
		}
		w.view.Acked(cl, &relaypb.PullAck{Version: set.GetVersion(), Results: results}, time.Now())
	}
}

func (w *rotationWorld) vm() *networkingv1alpha1.VirtualMesh {
	u, err := w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Get(w.ctx, "shared", metav1.GetOptions{})
	require.NoError(w.t, err)
	var vm networkingv1alpha1.VirtualMesh
	require.NoError(w.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vm))
	return &vm
}

func (w *rotationWorld) annotate(key, value string) {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	require.NoError(w.t, err)
	_, err = w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Patch(w.ctx, "shared", types.MergePatchType, body, metav1.PatchOptions{})
	require.NoError(w.t, err)
}

// waitFor syncs the agents until the VirtualMesh's rotation status satisfies
// cond.
func (w *rotationWorld) waitFor(what string, cond func(*networkingv1alpha1.RotationStatus) bool) *networkingv1alpha1.VirtualMesh {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.sync()
		vm := w.vm()
		if cond(vm.Status.Rotation) {
			return vm
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not within 30s; status.rotation %+v", what, vm.Status.Rotation)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func phaseIs(phase networkingv1alpha1.RotationPhase, awaiting bool) func(*networkingv1alpha1.RotationStatus) bool {
	return func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == phase && r.AwaitingContinue == awaiting
	}
}

// meshCAs reads every mesh's cacerts (public parts).
func (w *rotationWorld) meshCAs() map[string]*trust.MeshCA {
	out := map[string]*trust.MeshCA{}
	for _, cl := range w.clusters {
		s, err := w.kube.CoreV1().Secrets(w.meshNS[cl]).Get(w.ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(w.t, err)
		m, err := trust.ParseMeshCA(cl, w.meshNS[cl], s.Data)
		require.NoError(w.t, err)
		out[cl] = m
	}
	return out
}

// holds checks what every mesh holds: the roots of its bundle and the root
// its intermediate chains to.
func holds(t *testing.T, cas map[string]*trust.MeshCA, bundle []string, issuer string) {
	t.Helper()
	for cl, m := range cas {
		var got []string
		for _, r := range m.Roots {
			got = append(got, trust.Fingerprint(r))
		}
		assert.ElementsMatch(t, bundle, got, "%s: root-cert.pem", cl)
		top := m.Chain[len(m.Chain)-1]
		assert.Equal(t, issuer, trust.Fingerprint(top), "%s: cert-chain.pem ends in the root its intermediate is from", cl)
	}
}

// trustEachOther checks that every mesh's CA of one step verifies against
// every other mesh's bundle of the same and of the neighbouring step: what
// makes a rotation free of failed handshakes while agents apply a step at
// different times.
func trustEachOther(t *testing.T, steps ...map[string]*trust.MeshCA) {
	t.Helper()
	for _, a := range steps {
		for _, b := range steps {
			for ca, x := range a {
				for cb, y := range b {
					if ca == cb {
						continue
					}
					assert.NoError(t, x.VerifyAgainst(y, time.Now()), "%s's CA against %s's bundle", ca, cb)
				}
			}
		}
	}
}

// A MultiRoot rotation of a generated root with Manual verification: each
// phase is published only after every agent acked the one before and the
// operator asked to continue; at every phase, and across neighbouring
// phases, every mesh trusts every other; the server is restarted in the
// middle and resumes; after Finished the old root is trusted nowhere and
// its key is deleted.
func TestMultiRootRotation(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", true)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	require.NotNil(t, vm.Status.SharedTrust)
	require.NotNil(t, vm.Status.SharedTrust.Root, "status records where the root in force lives")
	old := vm.Status.SharedTrust.RootFingerprint
	oldSecret := vm.Status.SharedTrust.Root.GeneratedSecret
	before := w.meshCAs()
	holds(t, before, []string{old}, old)

	// A new generation of the generated root starts the rotation.
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm = w.waitFor("AddingNewRoot acked", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
	rot := vm.Status.Rotation
	assert.Equal(t, old, rot.OldRootFingerprint)
	nu := rot.NewRootFingerprint
	require.NotEqual(t, old, nu)
	assert.Equal(t, int32(1), rot.Step)
	assert.Empty(t, rot.PendingMeshes)
	assert.Equal(t, old, vm.Status.SharedTrust.RootFingerprint, "the old root is in force until Finished")
	adding := w.meshCAs()
	holds(t, adding, []string{old, nu}, old)
	trustEachOther(t, before, adding)

	// Without continue, Manual waits however often agents ack.
	for range 5 {
		w.sync()
	}
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, networkingv1alpha1.PhaseAddingNewRoot, w.vm().Status.Rotation.Phase)
	// A continue for another phase or root does not count.
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "DeletingOldRoot/"+nu)
	time.Sleep(300 * time.Millisecond)
	w.sync()
	assert.Equal(t, networkingv1alpha1.PhaseAddingNewRoot, w.vm().Status.Rotation.Phase)

	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+nu)
	w.waitFor("PropagatingNewIntermediate acked", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	propagating := w.meshCAs()
	holds(t, propagating, []string{old, nu}, nu)
	trustEachOther(t, adding, propagating)

	// The server dies here; a new one resumes from the status, with no
	// outputs and no acks in memory.
	w.stop()
	w.start()
	vm = w.waitFor("PropagatingNewIntermediate acked after a restart", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	assert.Equal(t, nu, vm.Status.Rotation.NewRootFingerprint)
	resumed := w.meshCAs()
	holds(t, resumed, []string{old, nu}, nu)
	for cl := range resumed {
		assert.True(t, resumed[cl].Intermediate.Equal(propagating[cl].Intermediate), "%s: the resumed server reissued nothing", cl)
	}

	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "PropagatingNewIntermediate/"+nu)
	w.waitFor("DeletingOldRoot acked", phaseIs(networkingv1alpha1.PhaseDeletingOldRoot, true))
	deleting := w.meshCAs()
	holds(t, deleting, []string{nu}, nu)
	trustEachOther(t, propagating, deleting)

	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "DeletingOldRoot/"+nu)
	vm = w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
	finished := w.meshCAs()
	holds(t, finished, []string{nu}, nu)
	trustEachOther(t, finished)
	for cl, m := range finished {
		assert.Error(t, m.VerifyAgainst(before[cl], time.Now()), "%s: after Finished a CA of the new root is not trusted by the old bundle", cl)
		assert.Error(t, before[cl].VerifyAgainst(m, time.Now()), "%s: after Finished the old root is trusted nowhere", cl)
	}
	_, err := w.kube.CoreV1().Secrets(w.ns).Get(w.ctx, oldSecret, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the replaced generated root's key is deleted: %v", err)
}

// A rollback from PropagatingNewIntermediate walks the steps back down,
// each after every agent acked, to the old root only; the rotation stays
// rolled back while the spec names the new root.
func TestRotationRollback(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", false)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	before := w.meshCAs()

	// Verification None: the rotation runs by itself once agents ack; the
	// test holds the agents back to catch PropagatingNewIntermediate.
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	var nu string
	var propagating map[string]*trust.MeshCA
	deadline := time.Now().Add(30 * time.Second)
	for propagating == nil {
		require.True(t, time.Now().Before(deadline), "PropagatingNewIntermediate not reached")
		w.sync()
		if r := w.vm().Status.Rotation; r != nil && r.Phase == networkingv1alpha1.PhasePropagatingNewIntermediate {
			// The status is written before the step is published: wait for
			// it, apply it, and sync no more until the rollback is asked.
			require.Eventually(t, func() bool {
				return w.outputs.Get("c1").GetTrust()[0].GetIssuer() == r.NewRootFingerprint &&
					w.outputs.Get("c2").GetTrust()[0].GetIssuer() == r.NewRootFingerprint
			}, 10*time.Second, 20*time.Millisecond)
			w.sync()
			nu, propagating = r.NewRootFingerprint, w.meshCAs()
		}
		time.Sleep(50 * time.Millisecond)
	}
	holds(t, propagating, []string{old, nu}, nu)

	w.annotate(networkingv1alpha1.AnnotationRotationRollback, nu)
	vm = w.waitFor("RolledBack", phaseIs(networkingv1alpha1.PhaseRolledBack, false))
	assert.Equal(t, old, vm.Status.SharedTrust.RootFingerprint)
	back := w.meshCAs()
	holds(t, back, []string{old}, old)
	trustEachOther(t, before, back)

	// Still rolled back a while later: the spec's root is not rotated to
	// again.
	time.Sleep(500 * time.Millisecond)
	w.sync()
	assert.Equal(t, networkingv1alpha1.PhaseRolledBack, w.vm().Status.Rotation.Phase)
	holds(t, w.meshCAs(), []string{old}, old)

	// A retry (`relaymesh ca rotate start`) rotates to the same root
	// again; the rollback annotation left from the first attempt is
	// removed, not applied to the retry.
	w.annotate(networkingv1alpha1.AnnotationRotationRetry, nu)
	vm = w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
	assert.Equal(t, nu, vm.Status.Rotation.NewRootFingerprint)
	assert.NotContains(t, vm.Annotations, networkingv1alpha1.AnnotationRotationRollback)
	holds(t, w.meshCAs(), []string{nu}, nu)

	// A new generation rotates again, to another new root.
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "3")
	vm = w.waitFor("Finished", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseFinished && r.NewRootFingerprint != nu
	})
	holds(t, w.meshCAs(), []string{vm.Status.Rotation.NewRootFingerprint}, vm.Status.Rotation.NewRootFingerprint)
}

// A VirtualMesh moves its generated root into an HSM: changing
// spec.mtls.shared.rootCA to pkcs11 rotates every mesh to the HSM's root,
// whose key signs every new intermediate through PKCS#11 (SoftHSM2).
func TestRotationToAnHSMRoot(t *testing.T) {
	module := hsmModule(t)
	k := newHSMKey(t, "rotation-root")
	w := newRotationWorld(t, "{generated: {}}", false, module)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	before := w.meshCAs()
	createSecret(t, w.kube, w.ns, "hsm-pin", map[string][]byte{"pin": []byte(hsmPIN)})
	createSecret(t, w.kube, w.ns, "hsm-root", map[string][]byte{"tls.crt": ca.CertsPEM(k.selfSigned)})
	w.applyVM(fmt.Sprintf("{pkcs11: {modulePath: %s, tokenLabel: %s, keyLabel: %s, pinSecretRef: {name: hsm-pin}, certificateSecretRef: {name: hsm-root}}}", module, hsmToken, k.label))
	vm = w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
	nu := trust.Fingerprint(k.selfSigned)
	assert.Equal(t, old, vm.Status.Rotation.OldRootFingerprint)
	assert.Equal(t, nu, vm.Status.Rotation.NewRootFingerprint)
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
	require.NotNil(t, vm.Status.SharedTrust.Root.PKCS11, "the HSM is the root in force")
	after := w.meshCAs()
	holds(t, after, []string{nu}, nu)
	trustEachOther(t, after)
	for cl := range after {
		assert.Error(t, before[cl].VerifyAgainst(after[cl], time.Now()), "%s: the generated root is trusted nowhere", cl)
	}
}

// From DeletingOldRoot (the old root already gone from every bundle), a
// rollback asked by naming the old root in the spec again walks back
// through every step, each trusted by its neighbours, to the old root only.
// With Manual verification each step back holds, however often agents ack,
// until a continue names it — also across a restart of the server.
func TestRotationRollbackFromDeletingOldRoot(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", true)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm = w.waitFor("AddingNewRoot acked", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
	nu := vm.Status.Rotation.NewRootFingerprint
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+nu)
	w.waitFor("PropagatingNewIntermediate acked", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "PropagatingNewIntermediate/"+nu)
	w.waitFor("DeletingOldRoot acked", phaseIs(networkingv1alpha1.PhaseDeletingOldRoot, true))
	prev := w.meshCAs()
	holds(t, prev, []string{nu}, nu)

	// The spec names the old root again (no generation annotation).
	body := []byte(`{"metadata":{"annotations":{"` + networkingv1alpha1.AnnotationRootGeneration + `":null}}}`)
	_, err := w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Patch(w.ctx, "shared", types.MergePatchType, body, metav1.PatchOptions{})
	require.NoError(t, err)
	want := map[int32]struct {
		bundle []string
		issuer string
	}{2: {[]string{old, nu}, nu}, 1: {[]string{old, nu}, old}, 0: {[]string{old}, old}}
	for step := int32(2); step >= 0; step-- {
		// Nothing moves on until the agents ack, so each step can be seen:
		// wait until it is published, then let the agents apply it.
		require.Eventually(t, func() bool {
			for _, cl := range w.clusters {
				req := w.outputs.Get(cl).GetTrust()[0]
				roots, err := pemutil.ParseCertificateBundle(req.GetRootBundle())
				if err != nil || req.GetIssuer() != want[step].issuer || len(roots) != len(want[step].bundle) {
					return false
				}
			}
			return true
		}, 10*time.Second, 20*time.Millisecond, "step %d published", step)
		w.sync()
		cur := w.meshCAs()
		holds(t, cur, want[step].bundle, want[step].issuer)
		trustEachOther(t, prev, cur)
		prev = cur
		if step == 0 {
			break // nothing more changes in the meshes: RolledBack needs no continue
		}
		atStep := func(r *networkingv1alpha1.RotationStatus) bool {
			return r != nil && r.Phase == networkingv1alpha1.PhaseRollingBack && r.Step == step && r.AwaitingContinue
		}
		vm = w.waitFor(fmt.Sprintf("step %d back held", step), atStep)
		for range 5 {
			w.sync()
			time.Sleep(50 * time.Millisecond)
		}
		require.True(t, atStep(w.vm().Status.Rotation), "step %d back still held after the agents acked it again: %+v", step, w.vm().Status.Rotation)
		holds(t, w.meshCAs(), want[step].bundle, want[step].issuer)
		if step == 2 {
			// A restarted server (empty outputs and acks) resumes the
			// hold from the status: it republishes step 2 and waits.
			w.stop()
			w.start()
			vm = w.waitFor("step 2 back held after a restart", atStep)
			holds(t, w.meshCAs(), want[step].bundle, want[step].issuer)
		}
		w.annotate(networkingv1alpha1.AnnotationRotationContinue, trust.ContinueValue(vm.Status.Rotation))
	}
	vm = w.waitFor("RolledBack", phaseIs(networkingv1alpha1.PhaseRolledBack, false))
	assert.Equal(t, old, vm.Status.SharedTrust.RootFingerprint)
}

// A new key algorithm for a generated root names a new root: the meshes
// rotate to an ECDSA P-384 root.
func TestRotationToAnotherKeyAlgorithm(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", false)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	w.applyVM("{generated: {keyAlgorithm: ECDSAP384}}")
	vm = w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
	nu := vm.Status.Rotation.NewRootFingerprint
	require.NotEqual(t, old, nu)
	cas := w.meshCAs()
	holds(t, cas, []string{nu}, nu)
	for cl, m := range cas {
		pub, ok := m.Roots[0].PublicKey.(*ecdsa.PublicKey)
		require.True(t, ok, cl)
		assert.Equal(t, "P-384", pub.Curve.Params().Name, "%s: the new root's key", cl)
	}
}

// A root that cannot be used does not start a rotation, and a root in force
// that disappears holds the meshes' CAs as they are instead of letting
// agents prune them.
func TestRotationRefusesBadRoots(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", false)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	before := w.meshCAs()

	// A root Secret that is not a CA.
	notCA := testLeafPEM(t)
	createSecret(t, w.kube, w.ns, "not-a-ca", map[string][]byte{corev1.TLSCertKey: notCA.cert, corev1.TLSPrivateKeyKey: notCA.key})
	w.applyVM("{secret: {name: not-a-ca}}")
	vm = w.waitFor("Failed", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseFailed
	})
	assert.Contains(t, vm.Status.Rotation.Message, "cannot be used")
	assert.Equal(t, old, vm.Status.SharedTrust.RootFingerprint)
	holds(t, w.meshCAs(), []string{old}, old)

	// The root in force disappears: the meshes keep their CAs.
	require.NoError(t, w.kube.CoreV1().Secrets(w.ns).Delete(w.ctx, vm.Status.SharedTrust.Root.GeneratedSecret, metav1.DeleteOptions{}))
	w.stop()
	w.start() // no cached root
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.sync()
		if st := w.vm().Status.SharedTrust; st != nil && st.Message != "" {
			assert.Contains(t, st.Message, "cannot be used")
			break
		}
		require.True(t, time.Now().Before(deadline), "no hold message")
		time.Sleep(100 * time.Millisecond)
	}
	w.sync()
	for _, cl := range w.clusters {
		reqs := w.outputs.Get(cl).GetTrust()
		require.Len(t, reqs, 1)
		assert.True(t, reqs[0].GetHold(), "%s: held", cl)
	}
	after := w.meshCAs()
	for cl := range after {
		assert.True(t, after[cl].Intermediate.Equal(before[cl].Intermediate), "%s: cacerts kept as it was", cl)
	}
}

type leafPEM struct{ cert, key []byte }

// testLeafPEM is a self-signed certificate that is not a CA, and its key.
func testLeafPEM(t *testing.T) leafPEM {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not a CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	block, err := pemutil.Serialize(key)
	require.NoError(t, err)
	return leafPEM{cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: pem.EncodeToMemory(block)}
}

// syncOne lets one cluster's agent apply its set and ack it.
func (w *rotationWorld) syncOne(cl string) {
	set := w.outputs.Get(cl)
	results, _ := w.agents[cl].Apply(w.ctx, set, func(ctx context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		return w.ctl.SignIntermediate(ctx, cl, r)
	})
	w.view.Acked(cl, &relaypb.PullAck{Version: set.GetVersion(), Results: results}, time.Now())
}

// stillThere checks, a while after something happened, that the rotation
// status still satisfies cond while only the agents given sync.
func (w *rotationWorld) stillThere(what string, clusters []string, cond func(*networkingv1alpha1.RotationStatus) bool) *networkingv1alpha1.VirtualMesh {
	w.t.Helper()
	var vm *networkingv1alpha1.VirtualMesh
	for range 8 {
		for _, cl := range clusters {
			w.syncOne(cl)
		}
		time.Sleep(100 * time.Millisecond)
		vm = w.vm()
		require.True(w.t, cond(vm.Status.Rotation), "%s: status.rotation %+v", what, vm.Status.Rotation)
	}
	return vm
}

// A step moves on only once every member's agent acked the current trust
// requests with the mesh's cacerts applied: not while one agent is silent,
// acks an older version, or reports an error for its cacerts.
func TestRotationWaitsForEveryAck(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", false)
	w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	before := w.outputs.Get("c2").GetVersion()
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	require.Eventually(t, func() bool {
		r := w.vm().Status.Rotation
		return r != nil && r.Phase == networkingv1alpha1.PhaseAddingNewRoot && w.outputs.Get("c2").GetVersion() > before
	}, 30*time.Second, 50*time.Millisecond)
	adding := func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseAddingNewRoot && r.Step == 1
	}

	vm := w.stillThere("c2 silent", []string{"c1"}, adding)
	assert.Equal(t, []string{"istiod-c2"}, vm.Status.Rotation.PendingMeshes)
	assert.Contains(t, vm.Status.Rotation.Message, "waiting for 1 of 2 meshes")

	ok := []*relaypb.ObjectResult{{ApiVersion: "v1", Kind: "Secret", Namespace: w.meshNS["c2"], Name: trust.SecretName, Outcome: "unchanged"}}
	w.view.Acked("c2", &relaypb.PullAck{Version: before, Results: ok}, time.Now())
	w.stillThere("c2 acked an older version", []string{"c1"}, adding)

	failed := []*relaypb.ObjectResult{{ApiVersion: "v1", Kind: "Secret", Namespace: w.meshNS["c2"], Name: trust.SecretName, Outcome: "error", Error: "boom"}}
	w.view.Acked("c2", &relaypb.PullAck{Version: w.outputs.Get("c2").GetVersion(), Results: failed}, time.Now())
	w.stillThere("c2 failed its cacerts", []string{"c1"}, adding)

	w.waitFor("Finished once c2 applies", phaseIs(networkingv1alpha1.PhaseFinished, false))
}

// Review findings: a rolled-back rotation stays rolled back when its new
// root breaks; a rollback works when the new root cannot be loaded; an
// Invalid VirtualMesh holds its meshes' CAs; a malformed status.rotation
// holds instead of crashing; a VirtualMesh cannot use another's generated
// root or the relay CA.
func TestRotationFailsClosed(t *testing.T) {
	// A broken new root can neither block a rollback nor undo it.
	t.Run("broken-new-root", func(t *testing.T) {
		w := newRotationWorld(t, "{generated: {}}", true)
		vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
		old := vm.Status.SharedTrust.RootFingerprint
		w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
		vm = w.waitFor("AddingNewRoot acked", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
		nu, newSecret := vm.Status.Rotation.NewRootFingerprint, vm.Status.Rotation.To.GeneratedSecret
		w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+nu)
		w.waitFor("PropagatingNewIntermediate acked", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))

		// The new root's key is gone, and the server restarts (no cache).
		require.NoError(t, w.kube.CoreV1().Secrets(w.ns).Delete(w.ctx, newSecret, metav1.DeleteOptions{}))
		w.stop()
		w.start()
		w.annotate(networkingv1alpha1.AnnotationRotationRollback, nu)
		// Manual verification holds the step back to intermediates of the
		// old root (which needs no new root's key) until its continue.
		w.waitFor("step 1 back held", phaseIs(networkingv1alpha1.PhaseRollingBack, true))
		w.annotate(networkingv1alpha1.AnnotationRotationContinue, "RollingBack/1/"+nu)
		w.waitFor("RolledBack", phaseIs(networkingv1alpha1.PhaseRolledBack, false))
		holds(t, w.meshCAs(), []string{old}, old)

		// Rolled back from a root that cannot be loaded: it stays so, and
		// the missing generated root is not made anew.
		w.stop()
		w.start()
		w.stillThere("still rolled back", w.clusters, phaseIs(networkingv1alpha1.PhaseRolledBack, false))
		_, err := w.kube.CoreV1().Secrets(w.ns).Get(w.ctx, newSecret, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the rolled-back root was generated again: %v", err)
		holds(t, w.meshCAs(), []string{old}, old)
	})

	// An Invalid VirtualMesh holds its meshes' CAs.
	t.Run("invalid", func(t *testing.T) {
		w := newRotationWorld(t, "{generated: {}}", false)
		w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
		before := w.meshCAs()
		w.applyVM("{generated: {}}", "not-discovered-yet")
		require.Eventually(t, func() bool {
			for _, cl := range w.clusters {
				reqs := w.outputs.Get(cl).GetTrust()
				if len(reqs) != 1 || !reqs[0].GetHold() {
					return false
				}
			}
			return true
		}, 30*time.Second, 50*time.Millisecond, "hold requests for both meshes")
		w.sync()
		after := w.meshCAs()
		for cl := range after {
			assert.True(t, after[cl].Intermediate.Equal(before[cl].Intermediate), "%s: cacerts kept", cl)
		}
	})

	// A malformed status.rotation holds.
	t.Run("malformed-status", func(t *testing.T) {
		w := newRotationWorld(t, "{generated: {}}", false)
		w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
		w.stop()
		_, err := w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Patch(w.ctx, "shared",
			types.MergePatchType, []byte(`{"status":{"rotation":{"phase":"AddingNewRoot","step":1}}}`), metav1.PatchOptions{}, "status")
		require.NoError(t, err)
		w.start()
		require.Eventually(t, func() bool {
			st := w.vm().Status.SharedTrust
			return st != nil && strings.Contains(st.Message, "status.rotation is incomplete")
		}, 30*time.Second, 50*time.Millisecond)
		for _, cl := range w.clusters {
			assert.True(t, w.outputs.Get(cl).GetTrust()[0].GetHold(), cl)
		}
	})

	t.Run("reserved-secrets", func(t *testing.T) {
		w := newRotationWorld(t, "{generated: {}}", false)
		vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
		old := vm.Status.SharedTrust.RootFingerprint
		for _, name := range []string{vm.Status.SharedTrust.Root.GeneratedSecret, ca.RootSecretName, ca.SigningSecretName} {
			if name != vm.Status.SharedTrust.Root.GeneratedSecret {
				createSecret(t, w.kube, w.ns, name, map[string][]byte{"tls.crt": []byte("x"), "tls.key": []byte("x")})
			}
			w.applyVM(fmt.Sprintf("{secret: {name: %s}}", name))
			vm = w.waitFor("Failed: "+name, func(r *networkingv1alpha1.RotationStatus) bool {
				return r != nil && r.Phase == networkingv1alpha1.PhaseFailed && strings.Contains(r.Message, name)
			})
			assert.Contains(t, vm.Status.Rotation.Message, "keeps for itself", name)
			assert.Equal(t, old, vm.Status.SharedTrust.RootFingerprint)
		}
	})
}

// BenchmarkRotation measures a whole MultiRoot rotation (verification None)
// of a generated root: from the new generation to Finished, every step
// written to the status, published and acked by every mesh's agent (a real
// trust.Agent writing cacerts into a real kube-apiserver, issuing a new
// intermediate at each of the three steps that change it).
func BenchmarkRotation(b *testing.B) {
	for _, n := range []int{2, 20} {
		b.Run(fmt.Sprintf("%d-meshes", n), func(b *testing.B) {
			w := newRotationWorldOf(b, n, "{generated: {}}", false)
			w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
			gen, last := 1, ""
			for b.Loop() {
				gen++
				w.annotate(networkingv1alpha1.AnnotationRootGeneration, fmt.Sprint(gen))
				deadline := time.Now().Add(time.Minute)
				for {
					// The agents apply as soon as a step is there, as
					// connected agents do.
					w.sync()
					if r := w.vm().Status.Rotation; r != nil && r.Phase == networkingv1alpha1.PhaseFinished && r.NewRootFingerprint != last {
						last = r.NewRootFingerprint
						break
					}
					require.True(b, time.Now().Before(deadline), "rotation %d did not finish within a minute", gen)
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
}

// A MultiRoot rotation never issues from a new root while a member mesh
// runs ambient (ztunnel trusts one root): it is refused at the start with
// the reason and the root in force kept, starts once no member runs
// ambient, is held in AddingNewRoot (however it is continued) when one
// turns ambient again, and can still be rolled back from there.
func TestAmbientMeshesRefuseMultiRoot(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", true)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	ambient := func(on bool) {
		patch := `{"spec":{"istio":{"ambient":null,"dataPlaneModes":null}}}`
		if on {
			patch = `{"spec":{"istio":{"ambient":{"ztunnel":true},"dataPlaneModes":["ambient"]}}}`
		}
		_, err := w.dyn.Resource(discoveryv1alpha1.Meshes).Namespace(w.ns).Patch(w.ctx, "istiod-c2", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	ambient(true)
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm = w.waitFor("refused", phaseIs(networkingv1alpha1.PhaseFailed, false))
	assert.Contains(t, vm.Status.Rotation.Message, "MultiRoot is refused while meshes run ambient (istiod-c2)")
	assert.Equal(t, old, vm.Status.SharedTrust.RootFingerprint, "the root in force stays")
	w.sync()
	holds(t, w.meshCAs(), []string{old}, old)

	ambient(false)
	vm = w.waitFor("AddingNewRoot acked", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
	nu := vm.Status.Rotation.NewRootFingerprint

	ambient(true)
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+nu)
	w.waitFor("held", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && strings.Contains(r.Message, "held: MultiRoot is refused while meshes run ambient")
	})
	for range 3 {
		w.sync()
	}
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, networkingv1alpha1.PhaseAddingNewRoot, w.vm().Status.Rotation.Phase, "never onto the new root while a member runs ambient")
	holds(t, w.meshCAs(), []string{old, nu}, old)

	w.annotate(networkingv1alpha1.AnnotationRotationRollback, nu)
	w.waitFor("RolledBack", phaseIs(networkingv1alpha1.PhaseRolledBack, false))
	holds(t, w.meshCAs(), []string{old}, old)
}
