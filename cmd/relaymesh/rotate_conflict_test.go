package main

import (
	"context"
	"strconv"
	"testing"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// statusWriteBeforePatch writes the VirtualMesh's status (as the server
// does while a rotation runs) before each of its next n Patch calls, so
// each of them meets a resourceVersion that moved since the read.
type statusWriteBeforePatch struct {
	dynamic.ResourceInterface
	t      *testing.T
	n      int
	status func(i int) string
	i      int
}

func (s *statusWriteBeforePatch) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	if len(sub) == 0 && s.i < s.n {
		_, err := s.ResourceInterface.Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"rotation":`+s.status(s.i)+`}}`), metav1.PatchOptions{}, "status")
		require.NoError(s.t, err)
		s.i++
	}
	return s.ResourceInterface.Patch(ctx, name, pt, data, opts, sub...)
}

// A rotation request that meets a status write between its read and its
// write (the server writes the VirtualMesh's status as a rotation runs)
// decides again and is written, when it decides the same; a continue whose
// phase moved on meanwhile is refused with nothing written; a VirtualMesh
// that keeps changing ends in the conflict after a bounded number of tries.
func TestRotationRequestsDecideAgainAfterAConflict(t *testing.T) {
	ctx := context.Background()
	mgmt, _, dyn := localcluster.Management(t, "")
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
`))
	require.NoError(t, err)
	kube := &kubeclient.Clients{Dynamic: dyn}
	g := &globals{namespace: "relaymesh"}
	vms := dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace("relaymesh")
	notRotating := func(i int) string {
		return `{"phase":"NotRotating","message":"written by the server ` + strconv.Itoa(i) + `"}`
	}
	annotations := func() map[string]string {
		u, err := vms.Get(ctx, "gen", metav1.GetOptions{})
		require.NoError(t, err)
		return u.GetAnnotations()
	}

	racing := &statusWriteBeforePatch{ResourceInterface: vms, t: t, n: 2, status: notRotating}
	_, annotation, value, err := annotateRotation(ctx, kube, g, racing, "gen", "relaymesh/gen", "start")
	require.NoError(t, err)
	assert.Equal(t, 2, racing.i, "two writes met a status write first")
	assert.Equal(t, networkingv1alpha1.AnnotationRootGeneration, annotation)
	assert.Equal(t, "2", value)
	assert.Equal(t, "2", annotations()[networkingv1alpha1.AnnotationRootGeneration])

	// Awaiting a continue of step 1; the status moves to step 2 awaiting
	// its own continue before the write: the continue meant for step 1 is
	// not written for step 2.
	_, err = vms.Patch(ctx, "gen", types.MergePatchType, []byte(`{"status":{"rotation":{"phase":"AddingNewRoot","step":1,"newRootFingerprint":"abcd","awaitingContinue":true}}}`), metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	moved := &statusWriteBeforePatch{ResourceInterface: vms, t: t, n: 1, status: func(int) string {
		return `{"phase":"PropagatingNewIntermediate","step":2,"newRootFingerprint":"abcd","awaitingContinue":true}`
	}}
	_, _, _, err = annotateRotation(ctx, kube, g, moved, "gen", "relaymesh/gen", "continue")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "changed while the request was written")
	assert.Empty(t, annotations()[networkingv1alpha1.AnnotationRotationContinue], "nothing written")

	// Always changing: the conflict, after a bounded number of tries.
	always := &statusWriteBeforePatch{ResourceInterface: vms, t: t, n: 100, status: func(i int) string {
		return `{"phase":"PropagatingNewIntermediate","step":2,"newRootFingerprint":"abcd","awaitingContinue":true,"message":"write ` + strconv.Itoa(i) + `"}`
	}}
	_, _, _, err = annotateRotation(ctx, kube, g, always, "gen", "relaymesh/gen", "continue")
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), "%v", err)
	assert.Equal(t, maxRotationAttempts, always.i)
	assert.Empty(t, annotations()[networkingv1alpha1.AnnotationRotationContinue])
}
