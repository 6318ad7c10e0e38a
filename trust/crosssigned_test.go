package trust_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/trust"
)

// issued is what a workload of one mesh holds after its istiod signed its
// certificate from the mesh's cacerts, the way ztunnel reads istiod's
// answer: the leaf, every certificate of cert-chain.pem, and the roots of
// root-cert.pem (istiod sends root-cert.pem as the answer's last element).
type issued struct {
	mesh  string
	leaf  *x509.Certificate
	chain []*x509.Certificate
	roots []*x509.Certificate
}

// issueWorkloads signs one workload certificate per mesh with the key of
// its cacerts, as its istiod does.
func (w *rotationWorld) issueWorkloads() map[string]issued {
	w.t.Helper()
	out := map[string]issued{}
	for _, cl := range w.clusters {
		s, err := w.kube.CoreV1().Secrets(w.meshNS[cl]).Get(w.ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(w.t, err)
		caCert, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
		require.NoError(w.t, err)
		caKey, err := pemutil.ParseKey(s.Data[trust.KeyCAKey])
		require.NoError(w.t, err)
		chain, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyChain])
		require.NoError(w.t, err)
		roots, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyRootCert])
		require.NoError(w.t, err)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(w.t, err)
		id, _ := url.Parse("spiffe://" + cl + ".local/ns/default/sa/ztunnel")
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			URIs: []*url.URL{id}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey.(crypto.Signer))
		require.NoError(w.t, err)
		leaf, err := x509.ParseCertificate(der)
		require.NoError(w.t, err)
		out[cl] = issued{mesh: cl, leaf: leaf, chain: chain, roots: roots}
	}
	return out
}

// singleRootTrust checks that every workload certificate of one step
// verifies against the one root every other mesh's workloads hold in the
// same and in the neighbouring steps: what makes a rotation free of failed
// handshakes for a data plane that trusts a single root, while agents (and
// istiods, and workloads) take a step at different times.
func singleRootTrust(t *testing.T, steps ...map[string]issued) {
	t.Helper()
	for _, a := range steps {
		for _, b := range steps {
			for _, x := range a {
				for _, y := range b {
					require.Len(t, y.roots, 1, "%s's root-cert.pem holds a single root", y.mesh)
					inter := x509.NewCertPool()
					for _, c := range x.chain {
						inter.AddCert(c)
					}
					roots := x509.NewCertPool()
					roots.AddCert(y.roots[0])
					_, err := x.leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
					assert.NoError(t, err, "a workload of %s against the root %s's workloads hold", x.mesh, y.mesh)
				}
			}
		}
	}
}

// crossIssuer is the cross-issuer annotation of every mesh's cacerts.
func (w *rotationWorld) crossIssuers() map[string]string {
	out := map[string]string{}
	for _, cl := range w.clusters {
		s, err := w.kube.CoreV1().Secrets(w.meshNS[cl]).Get(w.ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(w.t, err)
		out[cl] = s.Annotations[trust.CrossIssuerAnnotation]
	}
	return out
}

// A CrossSigned rotation of a VirtualMesh with an ambient member: it
// starts (MultiRoot would be refused), every mesh's root-cert.pem holds one
// root at every step, and a workload certificate of any step verifies
// against the single root of every other mesh at the same and at the
// neighbouring steps, forward through Finished and back in a rollback from
// DeletingOldRoot.
func TestCrossSignedRotationKeepsOneRoot(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", true)
	w.strategy = string(networkingv1alpha1.RotationCrossSigned)
	w.applyVM("{generated: {}}")
	_, err := w.dyn.Resource(discoveryv1alpha1.Meshes).Namespace(w.ns).Patch(w.ctx, "istiod-c2", types.MergePatchType,
		[]byte(`{"spec":{"istio":{"ambient":{"ztunnel":true},"dataPlaneModes":["ambient"]}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	before := w.issueWorkloads()
	holds(t, w.meshCAs(), []string{old}, old)

	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm = w.waitFor("AddingNewRoot acked", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
	rot := vm.Status.Rotation
	assert.Equal(t, networkingv1alpha1.RotationCrossSigned, rot.Strategy, "the rotation records its strategy")
	assert.Contains(t, rot.Message, "intermediates signed by the old root and by the new")
	nu := rot.NewRootFingerprint
	step1 := w.issueWorkloads()
	holds(t, w.meshCAs(), []string{old}, old)
	assert.Equal(t, map[string]string{"c1": nu, "c2": nu}, w.crossIssuers())
	singleRootTrust(t, before, step1)

	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+nu)
	w.waitFor("PropagatingNewIntermediate acked", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	step2 := w.issueWorkloads()
	holds(t, w.meshCAs(), []string{nu}, nu)
	assert.Equal(t, map[string]string{"c1": old, "c2": old}, w.crossIssuers())
	singleRootTrust(t, step1, step2)

	// A restarted server resumes the step and reissues nothing.
	cas := w.meshCAs()
	w.stop()
	w.start()
	w.waitFor("PropagatingNewIntermediate acked after a restart", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	for cl, m := range w.meshCAs() {
		assert.True(t, m.Intermediate.Equal(cas[cl].Intermediate), "%s: the resumed server reissued nothing", cl)
	}

	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "PropagatingNewIntermediate/"+nu)
	w.waitFor("DeletingOldRoot acked", phaseIs(networkingv1alpha1.PhaseDeletingOldRoot, true))
	step3 := w.issueWorkloads()
	holds(t, w.meshCAs(), []string{nu}, nu)
	assert.Equal(t, map[string]string{"c1": "", "c2": ""}, w.crossIssuers(), "the old root's signature leaves with step 3")
	singleRootTrust(t, step2, step3)
	for cl, m := range w.meshCAs() {
		assert.Len(t, m.Chain, 2, "%s: cert-chain.pem is the intermediate and the new root only", cl)
	}

	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "DeletingOldRoot/"+nu)
	vm = w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
	finished := w.issueWorkloads()
	singleRootTrust(t, step3, finished)
	for cl, x := range finished {
		roots := x509.NewCertPool()
		roots.AddCert(before[cl].roots[0])
		inter := x509.NewCertPool()
		for _, c := range x.chain {
			inter.AddCert(c)
		}
		_, err := x.leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		assert.Error(t, err, "%s: after Finished the old root verifies no new certificate", cl)
	}

	// A rollback from DeletingOldRoot walks the same steps back down.
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "3")
	vm = w.waitFor("AddingNewRoot acked", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseAddingNewRoot && r.AwaitingContinue && r.NewRootFingerprint != nu
	})
	third := vm.Status.Rotation.NewRootFingerprint
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+third)
	w.waitFor("PropagatingNewIntermediate acked", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "PropagatingNewIntermediate/"+third)
	w.waitFor("DeletingOldRoot acked", phaseIs(networkingv1alpha1.PhaseDeletingOldRoot, true))
	prev := w.issueWorkloads()
	holds(t, w.meshCAs(), []string{third}, third)
	w.annotate(networkingv1alpha1.AnnotationRotationRollback, third)
	for _, step := range []int32{2, 1} {
		vm = w.waitFor("RollingBack acked", func(r *networkingv1alpha1.RotationStatus) bool {
			return r != nil && r.Phase == networkingv1alpha1.PhaseRollingBack && r.Step == step && r.AwaitingContinue
		})
		cur := w.issueWorkloads()
		want := nu
		if step == 2 {
			want = third
		}
		holds(t, w.meshCAs(), []string{want}, want)
		singleRootTrust(t, prev, cur)
		prev = cur
		w.annotate(networkingv1alpha1.AnnotationRotationContinue, trust.ContinueValue(vm.Status.Rotation))
	}
	vm = w.waitFor("RolledBack", phaseIs(networkingv1alpha1.PhaseRolledBack, false))
	back := w.issueWorkloads()
	holds(t, w.meshCAs(), []string{nu}, nu)
	singleRootTrust(t, prev, back)
	assert.Equal(t, nu, vm.Status.SharedTrust.RootFingerprint)
}

// An agent of an earlier release ignores the request's second root, so it
// never reports holding one: the server does not count its ack of a
// CrossSigned step, and the rotation waits with its mesh pending (never
// moving on to a step its peers could not verify) until the agent acks
// like this release.
func TestCrossSignedWaitsForCapableAgents(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", false)
	w.strategy = string(networkingv1alpha1.RotationCrossSigned)
	w.applyVM("{generated: {}}")
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	w.earlier = map[string]bool{"c2": true}
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm = w.waitFor("AddingNewRoot pending c2", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseAddingNewRoot && len(r.PendingMeshes) == 1
	})
	assert.Equal(t, []string{"istiod-c2"}, vm.Status.Rotation.PendingMeshes)
	for range 5 {
		w.sync()
	}
	time.Sleep(300 * time.Millisecond)
	w.sync()
	rot := w.vm().Status.Rotation
	assert.Equal(t, networkingv1alpha1.PhaseAddingNewRoot, rot.Phase, "verification None, every agent acked, and still held")
	assert.Equal(t, []string{"istiod-c2"}, rot.PendingMeshes)
	holds(t, w.meshCAs(), []string{old}, old)

	w.earlier = nil
	vm = w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
	holds(t, w.meshCAs(), []string{vm.Status.Rotation.NewRootFingerprint}, vm.Status.Rotation.NewRootFingerprint)
}
