package main

import (
	"bytes"
	"context"
	"testing"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

func TestRotateRefusesBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"ca", "rotate"},
		{"ca", "rotate", "spin", "relaymesh/vm"},
		{"ca", "rotate", "start"},
		{"ca", "rotate", "start", "no-namespace"},
		{"ca", "rotate", "start", "a/b/c"},
		{"ca", "rotate", "start", "/vm"},
		{"ca", "rotate", "start", "relaymesh/vm", "extra"},
		{"ca", "rotate", "start", "relaymesh/vm", "--wait", "-1s"},
		{"ca", "rotate", "start", "relaymesh/vm", "--wait", "soon"},
	} {
		var out, errOut bytes.Buffer
		assert.NotEqual(t, 0, run(ctx, args, &out, &errOut), "%v", args)
		assert.Empty(t, out.String(), "%v", args)
	}
}

// The rotate verbs act only in the state they are meant for, and write
// exactly the annotation the server reads (naming the phase and root they
// mean).
func TestRotateAgainstAPIServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, _ := localcluster.Management(t, "")
	_, err := mgmt.Apply(ctx, "test", []byte(`
apiVersion: v1
kind: Namespace
metadata: {name: relaymesh}
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: gen, namespace: relaymesh}
spec:
  meshes: [{clusterName: c1, namespace: istio-system, name: istiod}]
  mtls: {shared: {rootCA: {generated: {}}}}
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: provided, namespace: relaymesh}
spec:
  meshes: [{clusterName: c1, namespace: istio-system, name: istiod}]
  mtls: {shared: {rootCA: {secret: {name: team-root}}}}
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: plain, namespace: relaymesh}
spec:
  meshes: [{clusterName: c1, namespace: istio-system, name: istiod}]
`))
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	vms := dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace("relaymesh")
	rotate := func(verb, vm string) (string, error) {
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"ca", "rotate", verb, vm, "--kubeconfig", mgmt.Kubeconfig}, &out, &errOut)
		if code != 0 {
			return out.String(), assert.AnError
		}
		return out.String(), nil
	}
	failsWith := func(verb, vm, want string) {
		t.Helper()
		var out, errOut bytes.Buffer
		require.NotEqual(t, 0, run(ctx, []string{"ca", "rotate", verb, vm, "--kubeconfig", mgmt.Kubeconfig}, &out, &errOut))
		assert.Contains(t, errOut.String(), want)
	}
	annotations := func(name string) map[string]string {
		u, err := vms.Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		return u.GetAnnotations()
	}
	setRotationOf := func(name, rot string) {
		_, err := vms.Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"rotation":`+rot+`}}`), metav1.PatchOptions{}, "status")
		require.NoError(t, err)
	}
	setRotation := func(rot string) { setRotationOf("gen", rot) }

	failsWith("start", "relaymesh/missing", "not found")
	failsWith("start", "relaymesh/plain", "no shared trust")
	failsWith("start", "relaymesh/provided", "point spec.mtls.shared.rootCA at the new root")
	failsWith("continue", "relaymesh/gen", "no rotation that can continue (NotRotating)")
	failsWith("rollback", "relaymesh/gen", "no rotation to roll back (NotRotating)")
	assert.Empty(t, annotations("gen"), "refused commands change nothing")

	out, err := rotate("start", "relaymesh/gen")
	require.NoError(t, err)
	assert.Contains(t, out, "relaymesh.io/root-generation=2")
	assert.Equal(t, "2", annotations("gen")[networkingv1alpha1.AnnotationRootGeneration])

	setRotation(`{"phase":"AddingNewRoot","step":1,"newRootFingerprint":"abcd"}`)
	failsWith("start", "relaymesh/gen", "already rotating (AddingNewRoot)")
	failsWith("continue", "relaymesh/gen", "not waiting for a continue")
	setRotation(`{"phase":"AddingNewRoot","step":1,"newRootFingerprint":"abcd","awaitingContinue":true}`)
	_, err = rotate("continue", "relaymesh/gen")
	require.NoError(t, err)
	assert.Equal(t, "AddingNewRoot/abcd", annotations("gen")[networkingv1alpha1.AnnotationRotationContinue])
	_, err = rotate("rollback", "relaymesh/gen")
	require.NoError(t, err)
	assert.Equal(t, "abcd", annotations("gen")[networkingv1alpha1.AnnotationRotationRollback])

	setRotation(`{"phase":"RollingBack","step":0,"newRootFingerprint":"abcd"}`)
	failsWith("rollback", "relaymesh/gen", "no rotation to roll back (RollingBack)")
	// A rollback held at a step (Manual verification) continues that step
	// back only: the annotation names it.
	setRotation(`{"phase":"RollingBack","step":2,"newRootFingerprint":"abcd","awaitingContinue":false}`)
	failsWith("continue", "relaymesh/gen", "not waiting for a continue")
	setRotation(`{"phase":"RollingBack","step":2,"newRootFingerprint":"abcd","awaitingContinue":true}`)
	_, err = rotate("continue", "relaymesh/gen")
	require.NoError(t, err)
	assert.Equal(t, "RollingBack/2/abcd", annotations("gen")[networkingv1alpha1.AnnotationRotationContinue])
	// A provided root rolled back from is tried again by start.
	setRotationOf("provided", `{"phase":"RolledBack","step":0,"newRootFingerprint":"ef01"}`)
	_, err = rotate("start", "relaymesh/provided")
	require.NoError(t, err)
	assert.Equal(t, "ef01", annotations("provided")[networkingv1alpha1.AnnotationRotationRetry])

	setRotation(`{"phase":"Finished","step":3,"newRootFingerprint":"abcd"}`)
	_, err = rotate("start", "relaymesh/gen")
	require.NoError(t, err)
	assert.Equal(t, "3", annotations("gen")[networkingv1alpha1.AnnotationRootGeneration])

	// A member mesh that runs ambient: MultiRoot is refused with the
	// reason, and nothing is annotated; rotationStrategy None is the
	// operator's explicit choice and goes on.
	_, err = mgmt.Apply(ctx, "test", []byte(`
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-istio-system-c1, namespace: relaymesh}
spec:
  istio:
    installation: {name: istiod, namespace: istio-system, cluster: c1}
    trustDomain: c1.local
    ambient: {ztunnel: true}
    dataPlaneModes: [ambient]
`))
	require.NoError(t, err)
	failsWith("start", "relaymesh/gen", "MultiRoot is refused while meshes run ambient (istiod-istio-system-c1)")
	assert.Equal(t, "3", annotations("gen")[networkingv1alpha1.AnnotationRootGeneration], "a refused start changes nothing")
	_, err = vms.Patch(ctx, "gen", types.MergePatchType, []byte(`{"spec":{"mtls":{"rotationStrategy":"None"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	_, err = rotate("start", "relaymesh/gen")
	require.NoError(t, err)
	assert.Equal(t, "4", annotations("gen")[networkingv1alpha1.AnnotationRootGeneration])
	// CrossSigned keeps one root in every bundle: what ambient needs.
	_, err = vms.Patch(ctx, "gen", types.MergePatchType, []byte(`{"spec":{"mtls":{"rotationStrategy":"CrossSigned"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	_, err = rotate("start", "relaymesh/gen")
	require.NoError(t, err)
	assert.Equal(t, "5", annotations("gen")[networkingv1alpha1.AnnotationRootGeneration])
	_, err = vms.Patch(ctx, "gen", types.MergePatchType, []byte(`{"spec":{"mtls":{"rotationStrategy":"MultiRoot"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	failsWith("start", "relaymesh/gen", "set rotationStrategy CrossSigned")
}
