package ha_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// canaryPolicy is a TrafficPolicy whose sources are the workloads labelled
// app=canary-client, in whichever cluster: its status lists them, as the
// Lease holder's translation found them, so it shows whether the holder
// reads Workloads discovered through other replicas.
const canaryPolicy = "canary-clients"

// TestFailoverWithRedis runs issue 22's checks with the replicas' full
// snapshots in Redis (--snapshot-store=redis: redis-server with TLS and a
// password, in a network namespace of its own): the world of TestFailover
// (3 replicas, 20 fleet agents, 2 real agents), then Redis SIGKILLed and
// started empty, one replica cut off from Redis (and only from it), and the
// Lease holder SIGKILLed (its successor reads every Workload from Redis). Throughout, the Lease holder's translation sees
// workloads pushed to other replicas (a TrafficPolicy's source workloads),
// and no agent receives or applies an older output version.
func TestFailoverWithRedis(t *testing.T) {
	w := newWorld(t, true)
	t.Run("WorkloadsInRedis", w.workloadsInRedis)
	t.Run("KillLeader", w.killLeader)
	t.Run("RestartRedis", w.restartRedis)
	t.Run("CutFromRedis", w.cutFromRedis)
	t.Run("Monotonic", w.monotonic)
	w.env.VerifyAudit(t)
}

// workloadsInRedis: the apiserver holds no Workload object, every
// cluster's status says where its Workloads are and counts them, Redis
// holds a verified record of every connected cluster, and the Lease
// holder's translation finds a workload pushed to another replica.
func (w *world) workloadsInRedis(t *testing.T) {
	ctx := w.ctx
	list, err := w.dyn.Resource(discoveryv1alpha1.Workloads).Namespace(w.env.Namespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items, "no Workload object in the apiserver with --snapshot-store=redis")

	for _, a := range w.agents {
		kc, err := w.dyn.Resource(kubernetesClusters).Namespace(w.env.Namespace).Get(ctx, a.cluster, metav1.GetOptions{})
		require.NoError(t, err)
		in, _, _ := unstructured.NestedString(kc.Object, "status", "discovered", "workloadsIn")
		n, _, _ := unstructured.NestedInt64(kc.Object, "status", "discovered", "workloads")
		assert.Equal(t, "redis", in, a.cluster)
		assert.Positive(t, n, a.cluster)
	}
	stored := w.storedClusters(t)
	for _, a := range w.agents {
		assert.Contains(t, stored, a.cluster, "Redis holds %s's snapshot", a.cluster)
	}

	// A canary workload in a cluster whose session is on a replica that
	// does not lead: the holder finds it only through Redis. And one in a
	// real cluster, discovered by a real agent wherever its session is.
	leader := w.waitLeader(t, nil)
	_, err = w.env.Mgmt.Apply(ctx, "test", []byte(fmt.Sprintf(`apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: %s, namespace: %s}
spec:
  sourceSelector: [{labels: {app: canary-client}}]
  destinationSelector:
  - kubeServiceRefs:
      services:
      - {name: reviews, namespace: bookinfo, clusterName: cluster-1}
      - {name: reviews, namespace: bookinfo, clusterName: cluster-2}
  policy:
    retries: {attempts: 2}
`, canaryPolicy, w.env.Namespace)))
	require.NoError(t, err)
	var follower *tracked
	for _, a := range w.agents {
		if a.fleet != nil && a.fleet.State().Connected && w.env.ReplicaAt(a.fleet.State().Server) != leader {
			follower = a
			break
		}
	}
	require.NotNil(t, follower, "a fleet agent on a replica that does not lead")
	start := time.Now()
	w.addCanary(t, follower.cluster, "canary-f")
	w.waitSources(t, 30*time.Second, follower.cluster+"/canary-f")
	t.Logf("a workload pushed to %s reached the Lease holder %s's translation in %s", w.env.ReplicaAt(follower.fleet.State().Server).Name,
		leader.Name, time.Since(start).Round(time.Millisecond))
	w.addCanary(t, "cluster-1", "canary-a")
	w.waitSources(t, 30*time.Second, follower.cluster+"/canary-f", "cluster-1/canary-a")
	w.canaries = []string{follower.cluster + "/canary-f", "cluster-1/canary-a"}
}

// restartRedis SIGKILLs Redis and starts it again empty. While it is down
// a policy edit is made, a workload added to cluster-2 and a cluster
// deregistered; no replica stops serving. After: the replicas refill the
// store with every connected cluster's snapshot (and none of the
// deregistered one), the edit reaches every cluster, and the new workload
// reaches the Lease holder's translation.
func (w *world) restartRedis(t *testing.T) {
	r := w.env.Redis
	// A store that no replica reaches is down, not a cut: no replica may
	// stop serving, during the outage or as they reconnect one by one.
	stopPoll := make(chan struct{})
	notReady := make(chan string, 1000)
	go func() {
		for {
			select {
			case <-stopPoll:
				close(notReady)
				return
			case <-time.After(200 * time.Millisecond):
			}
			for _, rep := range w.env.Replicas {
				if code, body, err := e2e.GetBody("https://" + rep.OpsAddr + "/readyz"); err == nil && code != 200 {
					select {
					case notReady <- rep.Name + ": " + strings.TrimSpace(body):
					default:
					}
				}
			}
		}
	}()
	require.NoError(t, r.Kill())
	killedAt := time.Now()
	editAt := w.editPolicy(t)
	w.addCanary(t, "cluster-2", "canary-b")
	// A deregistration while Redis is down ends the cluster's sessions on
	// every replica (it does not go through Redis).
	vic := w.victims["gone-1"]
	delSent := time.Now()
	require.NoError(t, w.dyn.Resource(kubernetesClusters).Namespace(w.env.Namespace).Delete(w.ctx, vic.cluster, metav1.DeleteOptions{}))
	delAt := time.Now()
	w.checkDeregistered(t, vic, delSent, delAt, nil)
	edit := w.waitSynced(t, editAt, w.agents, 30*time.Second, syncOpts{edit: true})
	t.Logf("edit while Redis was down → every cluster (max %s)", maxOf(edit).Round(time.Millisecond))
	// Down until every replica noticed, and longer than a replica waits
	// before it asks whether the others reach the store.
	e2e.Eventually(t, 30*time.Second, "every replica to notice the store is gone", func() (bool, string) {
		var up []string
		for _, rep := range w.env.Replicas {
			if v, err := rep.Metric("relaymesh_snapshot_store_subscribed"); err != nil || v != 0 {
				up = append(up, fmt.Sprint(rep.Name, " ", v, err))
			}
		}
		return len(up) == 0, strings.Join(up, ", ")
	})
	t.Logf("every replica noticed Redis was gone %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(10 * time.Second)
	require.NoError(t, r.Start(w.ctx))
	startedAt := time.Now()
	t.Logf("Redis down for %s, started again empty", startedAt.Sub(killedAt).Round(time.Millisecond))

	e2e.Eventually(t, 30*time.Second, "every connected cluster's snapshot back in Redis", func() (bool, string) {
		stored := w.storedClusters(t)
		var missing []string
		for _, a := range w.agents {
			if _, ok := stored[a.cluster]; !ok {
				missing = append(missing, a.cluster)
			}
		}
		return len(missing) == 0, strings.Join(missing, ",")
	})
	t.Logf("store refilled %s after its restart", time.Since(startedAt).Round(time.Millisecond))
	e2e.Eventually(t, 30*time.Second, "no record of the deregistered "+vic.cluster, func() (bool, string) {
		_, ok := w.storedClusters(t)[vic.cluster]
		return !ok, ""
	})
	w.canaries = append(w.canaries, "cluster-2/canary-b")
	w.waitSources(t, 30*time.Second, w.canaries...)
	editAt = w.editPolicy(t)
	edit = w.waitSynced(t, editAt, w.agents, 2*resyncGoal, syncOpts{edit: true})
	t.Logf("edit after Redis returned → every cluster (max %s)", maxOf(edit).Round(time.Millisecond))
	for _, rep := range w.env.Replicas {
		assert.Equal(t, codes.OK, w.renew(rep, w.probe), "%s serves", rep.Name)
	}
	close(stopPoll)
	var refusals []string
	for n := range notReady {
		refusals = append(refusals, n)
	}
	assert.Empty(t, refusals, "no replica stopped serving while Redis was down or coming back")
}

// cutFromRedis cuts the replica holding the real agents off from Redis
// (it still reaches the apiserver): it counts itself cut off (the others
// reach Redis), ends its sessions, refuses calls, says so in /readyz and
// gives up the Lease; its agents hold their heads on other replicas within
// the goal; a workload added to cluster-1 during the cut reaches the
// holder's translation and an edit every cluster. After the restore it
// serves again.
func (w *world) cutFromRedis(t *testing.T) {
	cut := w.env.ReplicaAt(w.sessionOf(t, w.realAgent(t, "cluster-1")))
	require.NotNil(t, cut)
	moved := w.on(cut)
	require.NotEmpty(t, moved)
	t.Logf("cutting %s off from Redis; it holds %d tracked agents; sessions: %s", cut.Name, len(moved), w.describeSessions())
	cutAt := time.Now()
	require.NoError(t, w.env.Net.CutRedis(cut.Index))
	t.Cleanup(func() { _ = w.env.Net.RestoreRedis(cut.Index) })

	// Noticed within a few pings (the store's timeout), decided after the
	// grace, with the others' Leases renewed every 5 s.
	const noticed = 20 * time.Second
	resync := w.waitSynced(t, cutAt, moved, noticed+resyncGoal, syncOpts{avoid: cut})
	t.Logf("cut from Redis → each of %s's agents on another replica holding its head (max %s): %s", cut.Name, maxOf(resync).Round(time.Millisecond), describe(resync))
	e2e.Eventually(t, 5*time.Second, "the cut replica refuses calls", func() (bool, string) {
		c := w.renew(cut, w.probe)
		return c == codes.Unavailable, c.String()
	})
	code, body, err := e2e.GetBody("https://" + cut.OpsAddr + "/readyz")
	require.NoError(t, err)
	assert.Equal(t, 503, code)
	assert.Contains(t, body, "snapshot store")
	holder, err := w.env.LeaseHolder(w.ctx)
	require.NoError(t, err)
	assert.NotEqual(t, cut.Name, holder, "a replica cut off from Redis does not lead")

	addAt := time.Now()
	w.addCanary(t, "cluster-1", "canary-c")
	w.canaries = append(w.canaries, "cluster-1/canary-c")
	w.waitSources(t, 30*time.Second, w.canaries...)
	t.Logf("a workload added during the cut reached the Lease holder's translation in %s", time.Since(addAt).Round(time.Millisecond))
	editAt := w.editPolicy(t)
	edit := w.waitSynced(t, editAt, w.agents, resyncGoal, syncOpts{edit: true, avoid: cut})
	t.Logf("edit during the cut → every cluster (max %s)", maxOf(edit).Round(time.Millisecond))

	restoreAt := time.Now()
	require.NoError(t, w.env.Net.RestoreRedis(cut.Index))
	e2e.Eventually(t, 60*time.Second, "the restored replica to serve", func() (bool, string) {
		c := w.renew(cut, w.probe)
		code, err := e2e.GetJSON("https://"+cut.OpsAddr+"/readyz", nil)
		return c == codes.OK && err == nil && code == 200, fmt.Sprint(c, " ", code, err)
	})
	t.Logf("restore → %s serves again after %s (cut for %s)", cut.Name, time.Since(restoreAt).Round(time.Millisecond), restoreAt.Sub(cutAt).Round(time.Millisecond))
	editAt = w.editPolicy(t)
	w.waitSynced(t, editAt, w.agents, 2*resyncGoal, syncOpts{edit: true})
	w.checkStatuses(t)
}

// storedClusters reads Redis as a replica would (the replicas' key from
// relay-snapshot-key-secret): the clusters with a record that verifies.
func (w *world) storedClusters(t *testing.T) map[string]string {
	t.Helper()
	sec, err := w.env.Kube.CoreV1().Secrets(w.env.Namespace).Get(w.ctx, "relay-snapshot-key-secret", metav1.GetOptions{})
	require.NoError(t, err)
	r := w.env.Redis
	store, err := snapshots.New(snapshots.Config{Address: w.env.Net.RedisAddr().String(), Password: r.Password(), TLS: r.TLS(), Key: sec.Data["key"]})
	require.NoError(t, err)
	defer store.Close()
	list, err := store.Clusters(w.ctx)
	if err != nil {
		return nil
	}
	for c := range list {
		if _, _, err := store.Get(w.ctx, c); err != nil {
			t.Errorf("the record of %s does not verify: %v", c, err)
		}
	}
	return list
}

// addCanary adds a workload labelled app=canary-client to cluster: a
// Deployment in the bookinfo namespace of a real cluster (its agent
// discovers it), or to a fleet cluster's snapshot (built by discovery from
// the simulated cluster with the Deployment added).
func (w *world) addCanary(t *testing.T, cluster, name string) {
	t.Helper()
	labels := map[string]string{"app": "canary-client", "canary": name}
	for _, a := range w.agents {
		if a.cluster != cluster || a.fleet == nil {
			continue
		}
		w.fleetCanaries[cluster] = append(w.fleetCanaries[cluster], name)
		in := fleet.SnapshotSpec{}.Inputs(cluster)
		for _, n := range w.fleetCanaries[cluster] {
			in.Deployments = append(in.Deployments, &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "bookinfo", Labels: labels},
				Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{ServiceAccountName: "canary", Containers: []corev1.Container{{Name: "client", Image: "docker.io/curlimages/curl:8.8.0"}}}}},
			})
		}
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bookinfo", Labels: map[string]string{"istio-injection": "enabled"}}})
		a.fleet.SetSnapshot(discovery.Build(cluster, in))
		return
	}
	_, err := w.env.Local.Cluster(cluster).Apply(w.ctx, "test", []byte(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s, namespace: bookinfo, labels: {app: canary-client}}
spec:
  selector: {matchLabels: {app: canary-client, canary: %s}}
  template:
    metadata: {labels: {app: canary-client, canary: %s}}
    spec:
      serviceAccountName: bookinfo-productpage
      containers: [{name: client, image: docker.io/curlimages/curl:8.8.0}]
`, name, name, name)))
	require.NoError(t, err)
}

// waitSources waits until the canary policy's status lists exactly the
// workloads want (cluster/name), as the Lease holder's translation found
// them.
func (w *world) waitSources(t *testing.T, timeout time.Duration, want ...string) {
	t.Helper()
	var names []string
	for _, cn := range want {
		cluster, name, _ := strings.Cut(cn, "/")
		names = append(names, discoveryv1alpha1.Name("Deployment", cluster, "bookinfo", name))
	}
	slices.Sort(names)
	e2e.Eventually(t, timeout, fmt.Sprintf("the source workloads %v in %s's status", want, canaryPolicy), func() (bool, string) {
		tp, err := w.dyn.Resource(networkingv1alpha1.TrafficPolicies).
			Namespace(w.env.Namespace).Get(w.ctx, canaryPolicy, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, _, _ := unstructured.NestedStringSlice(tp.Object, "status", "workloads")
		slices.Sort(got)
		return slices.Equal(got, names), fmt.Sprint(got)
	})
}

// realAgent is the tracked real agent of cluster.
func (w *world) realAgent(t *testing.T, cluster string) *tracked {
	t.Helper()
	for _, a := range w.agents {
		if a.real != nil && a.cluster == cluster {
			return a
		}
	}
	t.Fatalf("no real agent of %s", cluster)
	return nil
}

// sessionOf is the relay address of the replica holding a's session, as
// its cluster's status says.
func (w *world) sessionOf(t *testing.T, a *tracked) string {
	t.Helper()
	if a.fleet != nil {
		return a.fleet.State().Server
	}
	var addr string
	e2e.Eventually(t, 30*time.Second, a.name+"'s replica", func() (bool, string) {
		kc, err := w.dyn.Resource(kubernetesClusters).Namespace(w.env.Namespace).Get(w.ctx, a.cluster, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		name, _, _ := unstructured.NestedString(kc.Object, "status", "replica")
		if r := w.env.ReplicaNamed(name); r != nil {
			addr = r.RelayAddr
			return true, ""
		}
		return false, name
	})
	return addr
}
