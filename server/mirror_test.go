package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// The mirror writes a fleet's discovered objects from an informer cache:
// every cluster's objects appear, a change to one cluster writes only that
// cluster's changed object, nothing is listed per write, a hand-made object
// under a discovered name is never taken over (and does not hold up the
// rest), objects deleted by hand come back at the resync, and every object
// of a cluster that leaves — or was never registered — is deleted, a few
// DeleteCollections for all departed clusters at once.
func TestMirrorAtFleetRate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, admin := localcluster.Management(t, ns)

	const clusters = 300
	name := func(i int) string { return fmt.Sprintf("c%03d", i) }
	snap := func(i, services int) *relaypb.Snapshot {
		return fleet.SnapshotSpec{Services: services}.Snapshot(name(i))
	}

	// Objects of a cluster that is not registered (left while the server
	// was down), and a hand-made Destination under the name c007's
	// Destination will have.
	orphans, err := server.DiscoveredObjects(snap(999, 2), ns)
	require.NoError(t, err)
	for _, o := range orphans {
		_, err := admin.Resource(o.Resource).Namespace(ns).Create(ctx, o.Object, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	c7, err := server.DiscoveredObjects(snap(7, 1), ns)
	require.NoError(t, err)
	var squatted string
	for _, o := range c7 {
		if o.Resource == discoveryv1alpha1.Destinations {
			squatted = o.Object.GetName()
			hand := o.Object.DeepCopy()
			hand.SetLabels(map[string]string{"made-by": "hand"})
			_, err := admin.Resource(o.Resource).Namespace(ns).Create(ctx, hand, metav1.CreateOptions{})
			require.NoError(t, err)
		}
	}
	require.NotEmpty(t, squatted)

	// The server's client, counting its requests. A write refused with 409
	// (its cache had not seen someone else's edit yet) is retried, and
	// counted apart: under load the cache may lag.
	cfg := mgmt.RESTConfig()
	cfg.QPS, cfg.Burst = 400, 800
	var applies, conflicts, deletes, lists atomic.Int64
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			write := r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch
			switch {
			case r.Method == http.MethodDelete:
				deletes.Add(1)
			case r.Method == http.MethodGet && r.URL.Query().Get("watch") != "true" && !strings.Contains(r.URL.RawQuery, "watch=true"):
				lists.Add(1)
			}
			resp, err := rt.RoundTrip(r)
			if write {
				if err == nil && resp.StatusCode == http.StatusConflict {
					conflicts.Add(1)
				} else {
					applies.Add(1)
				}
			}
			return resp, err
		})
	}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	view := server.NewView()
	mirror := server.NewMirrorWithConfig(client, ns, view, slog.New(slog.NewTextHandler(io.Discard, nil)), server.MirrorConfig{Resync: 3 * time.Second})
	go mirror.Run(ctx)
	require.NoError(t, mirror.CollectOrphans(ctx, func(c string) bool { return c != name(999) }))

	objectsOf := func(cluster string) map[string]*unstructured.Unstructured {
		out := map[string]*unstructured.Unstructured{}
		for _, gvr := range []schema.GroupVersionResource{discoveryv1alpha1.Meshes, discoveryv1alpha1.Workloads, discoveryv1alpha1.Destinations} {
			sel := server.LabelCluster
			if cluster != "" {
				sel += "=" + cluster
			}
			l, err := admin.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			require.NoError(t, err)
			for i := range l.Items {
				out[gvr.Resource+"/"+l.Items[i].GetName()] = &l.Items[i]
			}
		}
		return out
	}
	waitFor := func(what string, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		require.Eventually(t, cond, 60*time.Second, 100*time.Millisecond, what)
		return time.Since(start)
	}

	took := waitFor("the unregistered cluster's objects are deleted", func() bool { return len(objectsOf(name(999))) == 0 })
	t.Logf("orphans deleted in %s", took)

	start := time.Now()
	for i := range clusters {
		view.Accept(name(i), snap(i, 1), time.Now())
	}
	// One Mesh, Workload and Destination per cluster, but c007's
	// Destination, whose name a hand-made object holds.
	waitFor("every cluster's objects are written", func() bool { return len(objectsOf("")) == 3*clusters-1 })
	t.Logf("%d clusters' objects written in %s: %d applies, %d lists", clusters, time.Since(start), applies.Load(), lists.Load())
	assert.EqualValues(t, 3*clusters-1, applies.Load(), "one apply per object, the squatted one never")
	assert.LessOrEqual(t, lists.Load(), int64(3), "the informers' lists only, never one per write")
	hand, err := admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Get(ctx, squatted, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"made-by": "hand"}, hand.GetLabels(), "the hand-made object is not taken over")

	// A second Service in one cluster: that cluster's new objects only.
	before := applies.Load()
	view.Accept(name(42), snap(42, 2), time.Now())
	waitFor("c042's second Service is written", func() bool { return len(objectsOf(name(42))) == 5 })
	time.Sleep(time.Second)
	assert.EqualValues(t, 2, applies.Load()-before, "a Workload and a Destination written, nothing else")

	// Back to one Service: the second Service's Workload and Destination
	// go, each by a DeleteCollection narrowed to its name and cluster.
	beforeDeletes := deletes.Load()
	view.Accept(name(42), snap(42, 1), time.Now())
	waitFor("c042's second Service is deleted", func() bool { return len(objectsOf(name(42))) == 3 })
	time.Sleep(time.Second)
	assert.EqualValues(t, 2, deletes.Load()-beforeDeletes, "two objects deleted, nothing else")
	assert.Len(t, objectsOf(""), 3*clusters-1, "no other cluster's objects touched")

	// A changed Service: its Destination is updated in place; a label
	// someone else added stays.
	var dest *unstructured.Unstructured
	for key, o := range objectsOf(name(9)) {
		if strings.HasPrefix(key, discoveryv1alpha1.Destinations.Resource+"/") {
			dest = o
		}
	}
	require.NotNil(t, dest)
	labels := dest.GetLabels()
	labels["team"] = "payments"
	dest.SetLabels(labels)
	_, err = admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Update(ctx, dest, metav1.UpdateOptions{})
	require.NoError(t, err)
	changed := snap(9, 1)
	changed.Destinations[0].Ports[0].Port = 9090
	changed.Hash = "changed"
	before = applies.Load()
	view.Accept(name(9), changed, time.Now())
	waitFor("c009's Destination is updated", func() bool {
		got, err := admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Get(ctx, dest.GetName(), metav1.GetOptions{})
		require.NoError(t, err)
		ports, _, _ := unstructured.NestedSlice(got.Object, "spec", "kubeService", "ports")
		return len(ports) == 1 && ports[0].(map[string]any)["port"] == int64(9090) && got.GetLabels()["team"] == "payments"
	})
	time.Sleep(time.Second)
	assert.EqualValues(t, 1, applies.Load()-before, "one update (%d refused as conflicts and retried)", conflicts.Load())

	// Deleted by hand: back at the resync.
	for key := range objectsOf(name(5)) {
		if strings.HasPrefix(key, discoveryv1alpha1.Workloads.Resource+"/") {
			require.NoError(t, admin.Resource(discoveryv1alpha1.Workloads).Namespace(ns).Delete(ctx, strings.TrimPrefix(key, discoveryv1alpha1.Workloads.Resource+"/"), metav1.DeleteOptions{}))
		}
	}
	waitFor("the deleted Workload is written again", func() bool { return len(objectsOf(name(5))) == 3 })

	// Every cluster leaves: everything of theirs is deleted; the hand-made
	// object stays.
	start = time.Now()
	beforeDeletes = deletes.Load()
	for i := range clusters {
		view.Remove(name(i))
	}
	waitFor("every cluster's objects are deleted", func() bool { return len(objectsOf("")) == 0 })
	t.Logf("%d clusters' objects deleted in %s: %d deletes", clusters, time.Since(start), deletes.Load()-beforeDeletes)
	// A DeleteCollection of each kind per batch of departed clusters, not
	// one delete per object (there are 3*clusters-1+2 = 901).
	assert.LessOrEqual(t, deletes.Load()-beforeDeletes, int64(30), "a few collections, not a delete per object")
	assert.Positive(t, deletes.Load()-beforeDeletes)
	_, err = admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Get(ctx, squatted, metav1.GetOptions{})
	require.NoError(t, err, "the hand-made object stays")

	// A cluster back after its objects were collected gets them again.
	view.Accept(name(3), snap(3, 1), time.Now())
	waitFor("the returning cluster's objects are written again", func() bool { return len(objectsOf(name(3))) == 3 })
}

// A Role from before DeleteCollection (list, watch, create, update, delete
// only): the mirror's collection is refused, and it deletes the departed
// clusters' objects one by one instead.
func TestMirrorDeletesOneByOneWithoutDeleteCollection(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, kube, admin := localcluster.Management(t, ns)
	const user = "mirror-without-deletecollection"
	_, err := kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{discoveryv1alpha1.GroupVersion.Group}, Resources: []string{"meshes", "workloads", "destinations"},
			Verbs: []string{"list", "watch", "create", "update", "delete"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := mgmt.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)

	view := server.NewView()
	mirror := server.NewMirrorWithConfig(client, ns, view, slog.New(slog.NewTextHandler(io.Discard, nil)), server.MirrorConfig{Resync: time.Hour})
	go mirror.Run(ctx)
	count := func(cluster string) int {
		n := 0
		for _, gvr := range []schema.GroupVersionResource{discoveryv1alpha1.Meshes, discoveryv1alpha1.Workloads, discoveryv1alpha1.Destinations} {
			l, err := admin.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster + "=" + cluster})
			require.NoError(t, err)
			n += len(l.Items)
		}
		return n
	}
	for _, c := range []string{"a", "b"} {
		view.Accept(c, fleet.SnapshotSpec{Services: 2}.Snapshot(c), time.Now())
	}
	require.Eventually(t, func() bool { return count("a") == 5 && count("b") == 5 }, 30*time.Second, 100*time.Millisecond)
	view.Remove("a")
	require.Eventually(t, func() bool { return count("a") == 0 }, 30*time.Second, 100*time.Millisecond, "deleted one by one after the collection was refused")
	assert.Equal(t, 5, count("b"), "another cluster's objects stay")
}

// A snapshot that changes while the mirror writes the previous one ends
// those writes: the rest is written from the new snapshot, and nothing is
// written from the old one after it was replaced. At a throttled client a
// cluster's first writes take seconds, as a 100,000-pod cluster's take
// minutes at the server's default budget.
func TestMirrorStopsWritingASupersededSnapshot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, admin := localcluster.Management(t, ns)
	cfg := mgmt.RESTConfig()
	cfg.QPS, cfg.Burst = 100, 1
	var writes atomic.Int64
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPost || r.Method == http.MethodPut {
				writes.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	view := server.NewView()
	mirror := server.NewMirrorWithConfig(client, ns, view, slog.New(slog.NewTextHandler(io.Discard, nil)), server.MirrorConfig{Resync: time.Hour})
	go mirror.Run(ctx)

	const services = 200
	old := fleet.SnapshotSpec{Services: services}.Snapshot("big")
	next := proto.Clone(old).(*relaypb.Snapshot)
	for _, d := range next.GetDestinations() {
		d.Labels = map[string]string{"generation": "2"}
	}
	next = relaytest.Rehash(next)
	want, err := server.DiscoveredObjects(next, ns)
	require.NoError(t, err)
	require.Len(t, want, 1+2*services)

	view.Accept("big", old, time.Now())
	require.Eventually(t, func() bool { return writes.Load() >= 20 }, 30*time.Second, time.Millisecond)
	view.Accept("big", next, time.Now())
	wantSums := fleet.SpecSums(want)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(wantSums, discoveredSums(ctx, t, admin, ns, "big")) }, time.Minute, 200*time.Millisecond,
		"the new snapshot's objects, and only those")
	// Written from the old snapshot: what was written or in flight when
	// the new one arrived. Had the old one's writes gone on, all 401 of
	// them would have been created and its 200 Destinations then updated
	// (601 writes).
	assert.Less(t, writes.Load(), int64(len(want)+services/2), "writes: the old snapshot's stopped when the new one arrived")
	t.Logf("%d writes for %d objects", writes.Load(), len(want))
}

// The sums the mirror writes in each object's annotation are those of
// every earlier release: a change in them would make the first server of a
// new release rewrite every discovered object of the fleet. goldenSums is
// the SHA-256 of the sorted "resource/name=sum" lines of relaytest.Golden(20)'s
// objects, as written by the releases up to 4319ea2.
func TestDiscoveredObjectSumsAreUnchanged(t *testing.T) {
	const goldenSums = "a376119b4d755554ed99762f997ab4aaa2ded609fe4f253cff39cc3e0aef5302"
	objs, err := server.DiscoveredObjects(relaytest.Golden(20), "relaymesh")
	require.NoError(t, err)
	require.NotEmpty(t, objs)
	var lines []string
	for _, o := range objs {
		sum := o.Object.GetAnnotations()[server.AnnotationSpecSum]
		require.Len(t, sum, 64, "%s %s", o.Resource.Resource, o.Object.GetName())
		lines = append(lines, o.Resource.Resource+"/"+o.Object.GetName()+"="+sum)
	}
	slices.Sort(lines)
	digest := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	assert.Equal(t, goldenSums, hex.EncodeToString(digest[:]), "%d objects", len(objs))
}

// Once the mirror has written a large snapshot the view holds it packed;
// the mirror then repairs from the packed snapshot (an object deleted by
// hand comes back) and a changed snapshot is written and packed in turn.
func TestMirrorRepairsFromAPackedSnapshot(t *testing.T) {
	const ns = "relaymesh"
	view := server.NewView()
	ctx, admin := startMirror(t, ns, view, slog.New(slog.NewTextHandler(io.Discard, nil)), server.MirrorConfig{Resync: time.Hour})

	mirrored := func(snap *relaypb.Snapshot) {
		t.Helper()
		objs, err := server.DiscoveredObjects(snap, ns)
		require.NoError(t, err)
		want := fleet.SpecSums(objs)
		require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, discoveredSums(ctx, t, admin, ns, "big")) }, time.Minute, 100*time.Millisecond,
			"the snapshot's %d objects, and only those", len(want))
		require.Eventually(t, func() bool { cv, _ := view.State("big"); return cv.PackedBytes > 0 }, 10*time.Second, 10*time.Millisecond,
			"the view holds the written snapshot packed")
	}

	snap := relaytest.Rich{Namespaces: 32}.Snapshot("big")
	require.Greater(t, proto.Size(snap), server.PackAbove)
	want := proto.Clone(snap).(*relaypb.Snapshot)
	view.Accept("big", snap, time.Now())
	mirrored(want)
	got, err := view.Load("big")
	require.NoError(t, err)
	assert.True(t, proto.Equal(want, got), "the packed snapshot is the one accepted")

	// Deleted by hand: the informer's delete handler queues the cluster,
	// whose sync reads the packed snapshot.
	dests, err := admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster + "=big", Limit: 3})
	require.NoError(t, err)
	require.Len(t, dests.Items, 3)
	for _, d := range dests.Items {
		require.NoError(t, admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Delete(ctx, d.GetName(), metav1.DeleteOptions{}))
	}
	mirrored(want)

	next := proto.Clone(want).(*relaypb.Snapshot)
	next.Destinations = next.Destinations[1:]
	next.Destinations[0].Labels = map[string]string{"generation": "2"}
	next = relaytest.Rehash(next)
	view.Accept("big", proto.Clone(next).(*relaypb.Snapshot), time.Now())
	mirrored(next)
	got, err = view.Load("big")
	require.NoError(t, err)
	assert.True(t, proto.Equal(next, got), "the next snapshot, packed")
}

// The resync compares only clusters something happened to since their
// last sync found them as their snapshot has them: an unchanged cluster
// (for a large one, its snapshot decoded and every object's sum worked
// out) is skipped, and an object edited by hand still brings its cluster
// back into the comparison and is repaired.
func TestMirrorResyncSkipsUnchangedClusters(t *testing.T) {
	const ns = "relaymesh"
	var logs syncbuf.Buffer
	view := server.NewView()
	ctx, admin := startMirror(t, ns, view, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		server.MirrorConfig{Resync: 200 * time.Millisecond})

	var want []*relaypb.Snapshot
	for _, c := range []string{"c1", "c2"} {
		snap := fleet.SnapshotSpec{Services: 3}.Snapshot(c)
		want = append(want, snap)
		view.Accept(c, proto.Clone(snap).(*relaypb.Snapshot), time.Now())
	}
	// The last resync logged: clusters compared and skipped.
	lastResync := func() (compared, unchanged float64) {
		for _, line := range slices.Backward(strings.Split(strings.TrimSpace(logs.String()), "\n")) {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "mirror resync" {
				compared, _ = rec["clusters_compared"].(float64)
				unchanged, _ = rec["clusters_unchanged"].(float64)
				return compared, unchanged
			}
		}
		return -1, -1
	}
	require.Eventually(t, func() bool { c, u := lastResync(); return c == 0 && u == 2 }, 30*time.Second, 50*time.Millisecond,
		"both clusters skipped once mirrored and compared")

	// An edit by hand of c1's Destination (its spec sum): c1 is compared
	// at the next resync, the edit undone, and c1 then skipped again.
	dests, err := admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster + "=c1"})
	require.NoError(t, err)
	require.NotEmpty(t, dests.Items)
	d := dests.Items[0]
	sum := d.GetAnnotations()[server.AnnotationSpecSum]
	require.NotEmpty(t, sum)
	d.SetAnnotations(map[string]string{server.AnnotationSpecSum: "edited"})
	_, err = admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Update(ctx, &d, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).Get(ctx, d.GetName(), metav1.GetOptions{})
		return err == nil && got.GetAnnotations()[server.AnnotationSpecSum] == sum
	}, 30*time.Second, 50*time.Millisecond, "the edited Destination repaired by a resync")
	require.Eventually(t, func() bool { c, u := lastResync(); return c == 0 && u == 2 }, 30*time.Second, 50*time.Millisecond,
		"both skipped again")

	// A new snapshot of c2 is written as ever.
	next := proto.Clone(want[1]).(*relaypb.Snapshot)
	next.Destinations = next.Destinations[1:]
	next = relaytest.Rehash(next)
	view.Accept("c2", next, time.Now())
	objs, err := server.DiscoveredObjects(next, ns)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := admin.Resource(discoveryv1alpha1.Destinations).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster + "=c2"})
		n := 0
		for _, o := range objs {
			if o.Resource == discoveryv1alpha1.Destinations {
				n++
			}
		}
		return err == nil && len(l.Items) == n
	}, 30*time.Second, 50*time.Millisecond, "c2's removed Destination deleted")
}

// startMirror runs a mirror of view with cfg on a new management cluster
// until the test ends, its client not throttled; admin reads and writes
// that cluster.
func startMirror(t *testing.T, ns string, view *server.View, log *slog.Logger, cfg server.MirrorConfig) (ctx context.Context, admin dynamic.Interface) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mgmt, _, admin := localcluster.Management(t, ns)
	rc := mgmt.RESTConfig()
	rc.QPS, rc.Burst = 1000, 1000
	client, err := dynamic.NewForConfig(rc)
	require.NoError(t, err)
	go server.NewMirrorWithConfig(client, ns, view, log, cfg).Run(ctx)
	return ctx, admin
}

// discoveredSums reads the discovered objects of cluster in ns, resource/name
// to spec sum. It is read on require.Eventually's goroutine: a failed list
// is logged and returns nil, a retry, not a failure of the test from there.
func discoveredSums(ctx context.Context, t *testing.T, admin dynamic.Interface, ns, cluster string) map[string]string {
	out := map[string]string{}
	for _, gvr := range []schema.GroupVersionResource{discoveryv1alpha1.Meshes, discoveryv1alpha1.Workloads, discoveryv1alpha1.Destinations} {
		l, err := admin.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster + "=" + cluster})
		if err != nil {
			t.Logf("list %s: %v", gvr.Resource, err)
			return nil
		}
		for _, o := range l.Items {
			out[gvr.Resource+"/"+o.GetName()] = o.GetAnnotations()[server.AnnotationSpecSum]
		}
	}
	return out
}
