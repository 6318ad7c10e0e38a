package app

import (
	"context"
	"crypto/x509"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// The SPIFFE bundle state is written only over the ConfigMap the writer
// read: a writer whose cache lags a newer write (another Lease holder's,
// moments before the Lease moved) neither overwrites it nor fails, but is
// woken to read again; with the current ConfigMap in its cache the write
// lands, and drops the keys someone else added.
func TestBundleStateIsWrittenOnlyOverTheConfigMapItRead(t *testing.T) {
	ctx := context.Background()
	const ns = "relaymesh"
	_, admin, _ := localcluster.Management(t, ns)
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "bookinfo", TTL: 24 * time.Hour})
	require.NoError(t, err)
	members := []spiffefed.Member{{VirtualMesh: ns + "/bookinfo", TrustDomain: "cluster-1.local", Roots: []*x509.Certificate{root.Cert}}}
	b := &bundleEndpoint{kube: admin, namespace: ns, hint: time.Minute, log: slog.New(slog.DiscardHandler), clock: time.Now,
		members: func() []spiffefed.Member { return members }, leading: func() bool { return true },
		lister: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), wake: make(chan struct{}, 1)}
	b.served.Store(&spiffefed.Snapshot{})
	cms := admin.CoreV1().ConfigMaps(ns)

	require.NoError(t, b.write(ctx), "nothing stored yet: created")
	first, err := cms.Get(ctx, BundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, b.lister.Add(first.DeepCopy()))

	// Someone writes after the writer's cache saw first.
	newer := first.DeepCopy()
	newer.Data["someone-elses"] = "x"
	newer, err = cms.Update(ctx, newer, metav1.UpdateOptions{})
	require.NoError(t, err)
	members = append(members, spiffefed.Member{VirtualMesh: ns + "/bookinfo", TrustDomain: "cluster-2.local", Roots: []*x509.Certificate{root.Cert}})
	require.NoError(t, b.write(ctx), "a conflict is no error")
	select {
	case <-b.wake:
	default:
		t.Fatal("a write that conflicted does not wake the writer to read again")
	}
	got, err := cms.Get(ctx, BundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, newer.ResourceVersion, got.ResourceVersion, "the newer ConfigMap is not overwritten")
	assert.Equal(t, newer.Data, got.Data)

	require.NoError(t, b.lister.Update(got))
	require.NoError(t, b.write(ctx))
	got, err = cms.Get(ctx, BundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, newer.ResourceVersion, got.ResourceVersion)
	assert.Equal(t, []string{BundleStateKey}, slices.Sorted(maps.Keys(got.Data)), "the keys someone added are removed")
	st, err := spiffefed.Decode([]byte(got.Data[BundleStateKey]))
	require.NoError(t, err)
	assert.Equal(t, []string{"cluster-1.local", "cluster-2.local"}, slices.Sorted(maps.Keys(st.Bundles)))
}
