package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// snapshotWorld is one `relaymesh server` process on a real management
// apiserver, keeping its snapshots in a real redis-server
// (--snapshot-store=redis), with clusters whose agents are the fleet's
// (agent.Session, the real agent's session code) or hostile ones.
type snapshotWorld struct {
	// t is the whole test's: what lives across subtests stops with it.
	t     *testing.T
	ctx   context.Context
	env   *fleet.Env
	srv   *fleet.Server
	redis *localcluster.Redis
	// raw is someone with write access to Redis, without the replicas'
	// key; store reads it as a replica does, with the key.
	raw   *redis.Client
	store *snapshots.Store
	// agents of cluster-1 and cluster-2, and the canaries each pushes.
	agents   map[string]*fleet.Agent
	canaries map[string][]string
}

// TestSnapshotBoundariesAgainstTheServerProcess replays issue 27's attacks
// on the snapshot path against the server as a process: compromised
// clusters holding its memory for snapshots in transit while legitimate
// clusters push (every legitimate snapshot is accepted; the test reports
// their latency), a forged delete announcement in Redis (no workload
// leaves translation), and an older genuine record written back to Redis
// (no removed workload comes back). RELAYMESH_BIN runs it against another
// build (docs/benchmarks.md: the same command against the previous
// release).
func TestSnapshotBoundariesAgainstTheServerProcess(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	dir := t.TempDir()
	env, err := fleet.StartEnv(ctx, fleet.EnvConfig{Dir: filepath.Join(dir, "fleet")})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	redisDir := filepath.Join(dir, "redis")
	require.NoError(t, os.MkdirAll(redisDir, 0o700))
	// A loopback address of its own: the port it picks is then no one
	// else's to take.
	var b [2]byte
	_, _ = rand.Read(b[:])
	rds, err := localcluster.StartRedis(ctx, localcluster.RedisConfig{Dir: redisDir, Bind: []net.IP{net.IPv4(127, 27, b[0], b[1]|1)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rds.Stop() })
	srv, err := env.StartServer(ctx, "server", func(c *fleet.ServerConfig) {
		c.Args = []string{"--snapshot-store=redis", "--redis-address", rds.Address(), "--redis-password-file", rds.PasswordFile(), "--redis-ca-file", rds.CAFile()}
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = srv.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(srv.LogPath())
			t.Logf("---- server log ----\n%s", tail(string(b), 60))
		}
	})
	w := &snapshotWorld{t: t, ctx: ctx, env: env, srv: srv, redis: rds, agents: map[string]*fleet.Agent{}, canaries: map[string][]string{}}
	w.raw = redis.NewClient(&redis.Options{Addr: rds.Address(), Password: rds.Password(), TLSConfig: rds.TLS(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = w.raw.Close() })

	t.Run("HostileClustersHoldReservations", w.hostileClustersHoldReservations)
	t.Run("ForgedAnnouncement", w.forgedAnnouncement)
	t.Run("ReplayedRecord", w.replayedRecord)
}

// register registers the clusters and returns their members (with their
// tokens: secrets, never logged).
func (w *snapshotWorld) register(t *testing.T, names ...string) []fleet.Member {
	t.Helper()
	members, err := w.env.Mgmt.Register(w.ctx, names, time.Hour, 8)
	require.NoError(t, err)
	return members
}

// serverOnly is how an agent reaches the server before it has a
// certificate.
func (w *snapshotWorld) serverOnly(t *testing.T) *tls.Config {
	t.Helper()
	roots, err := w.env.Mgmt.RelayRoots(w.ctx)
	require.NoError(t, err)
	host, _, _ := net.SplitHostPort(w.srv.Addr)
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: host}
}

// client is a Discovery client with m's certificate.
func (w *snapshotWorld) client(t *testing.T, m fleet.Member) relaypb.DiscoveryClient {
	t.Helper()
	serverOnly := w.serverOnly(t)
	cert, err := fleet.Bootstrap(w.ctx, w.srv.Addr, serverOnly, serverOnly.RootCAs, m)
	require.NoError(t, err)
	mtls := serverOnly.Clone()
	mtls.Certificates = []tls.Certificate{cert}
	conn, err := grpc.NewClient(w.srv.Addr, grpc.WithTransportCredentials(credentials.NewTLS(mtls)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return relaypb.NewDiscoveryClient(conn)
}

// agent starts a fleet agent of m that pushes snap, until t ends.
func (w *snapshotWorld) agent(t *testing.T, m fleet.Member, snap *relaypb.Snapshot) *fleet.Agent {
	t.Helper()
	serverOnly := w.serverOnly(t)
	a, err := fleet.NewAgent(fleet.AgentConfig{Cluster: m.Cluster, Token: m.Token, Servers: []string{w.srv.Addr}, Roots: serverOnly.RootCAs, Snapshot: snap})
	require.NoError(t, err)
	a.Start(w.ctx)
	t.Cleanup(a.Stop)
	return a
}

// Compromised clusters hold the server's memory for snapshots in transit
// every way the previous release let them — four send a header announcing
// 64 MiB and nothing more (issue 27's attack), six send the parts whose
// decoding takes the most memory per byte (64 KiB parts of empty
// workloads, about 9 MiB each) and hold them, each opening a new stream
// whenever one is refused — while eight legitimate clusters (snapshots of
// about 2 KiB) connect and push. Every legitimate snapshot is accepted; the
// test reports how long each took from its session's start, and what the
// hostile streams met.
func (w *snapshotWorld) hostileClustersHoldReservations(t *testing.T) {
	const budget = 512 << 20 // the server's default
	headers := w.register(t, fleet.ClusterNames("holder", 4)...)
	amplifiers := w.register(t, fleet.ClusterNames("amplifier", 6)...)
	legit := w.register(t, fleet.ClusterNames("legit", 8)...)

	ctx, stop := context.WithCancel(w.ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	var holders []*relaytest.Holder
	for _, m := range headers {
		holders = append(holders, &relaytest.Holder{Client: w.client(t, m), Cluster: m.Cluster})
	}
	for _, m := range amplifiers {
		holders = append(holders, &relaytest.Holder{Client: w.client(t, m), Cluster: m.Cluster, Parts: 10, Retry: 200 * time.Millisecond})
	}
	var peak float64
	var mu sync.Mutex
	reserved := func() float64 {
		m, err := w.srv.Metrics(ctx)
		if err != nil {
			return 0
		}
		return m.Sum(server.MetricSnapshotAssembly)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			r := reserved()
			mu.Lock()
			peak = max(peak, r)
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	run := func(hs []*relaytest.Holder) {
		for _, h := range hs {
			wg.Add(1)
			go func() { defer wg.Done(); h.Run(ctx) }()
		}
	}
	// The header-only holders first, as issue 27 attacked: four headers
	// of 64 MiB reserved the whole budget before any part came. Given up
	// to 5 s to take it (they take none where a header reserves nothing),
	// then the amplifiers join.
	run(holders[:len(headers)])
	for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait) && reserved() < budget; {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("header-only holders hold %.0f MiB of %d after %s", reserved()/(1<<20), budget>>20, time.Since(start).Round(time.Millisecond))
	run(holders[len(headers):])
	Eventually(t, time.Minute, "the hostile clusters hold most of the memory", func() (bool, string) {
		r := reserved()
		return r >= budget/2, fmt.Sprintf("%.0f MiB", r/(1<<20))
	})
	t.Logf("hostile clusters hold %.0f MiB of %d after %s", reserved()/(1<<20), budget>>20, time.Since(start).Round(time.Millisecond))

	var agents []*fleet.Agent
	for _, m := range legit {
		agents = append(agents, w.agent(t, m, fleet.SnapshotSpec{}.Snapshot(m.Cluster)))
	}
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		done := 0
		for _, a := range agents {
			if !a.State().Timeline.Pushed.IsZero() {
				done++
			}
		}
		if done == len(agents) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var took []time.Duration
	var refusedWith string
	for _, a := range agents {
		st := a.State()
		if st.Timeline.Pushed.IsZero() {
			refusedWith = st.PushError
			continue
		}
		took = append(took, st.Timeline.Pushed.Sub(st.Timeline.Session))
	}
	slices.Sort(took)
	if len(took) > 0 {
		t.Logf("legitimate snapshots accepted while hostile clusters held reservations: %d of %d; from session to accepted: min %s, median %s, max %s",
			len(took), len(agents), took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	}
	if len(took) < len(agents) {
		t.Logf("legitimate snapshots not accepted within 45 s: %d of %d; the last refusal: %s", len(agents)-len(took), len(agents), refusedWith)
	}
	m, err := w.srv.Metrics(ctx)
	require.NoError(t, err)
	reasons := map[string]float64{}
	for _, r := range []string{"idle", "slow", "deadline", "memory", "preempted", "cluster_busy", "rate_limited", "framing", "too_large", "invalid"} {
		if v := m.Sum(server.MetricSnapshotsRefused, `reason="`+r+`"`); v > 0 {
			reasons[r] = v
		}
	}
	codesSeen := map[codes.Code]int{}
	for _, h := range holders {
		r, _ := h.Refusals()
		for c, n := range r {
			codesSeen[c] += n
		}
	}
	mu.Lock()
	t.Logf("hostile streams refused, by code: %v; the server's refusals, by reason: %v; peak memory for snapshots in transit %.0f MiB", codesSeen, reasons, peak/(1<<20))
	assert.LessOrEqual(t, peak, float64(budget), "the memory is never exceeded")
	mu.Unlock()
	assert.Len(t, took, len(agents), "every legitimate snapshot is accepted")
	stop()
}

// canarySnapshot is cluster's snapshot (fleet.SnapshotSpec: one Service,
// svc-0 in apps-0) with a Deployment labelled app=canary-client for each
// canary.
func canarySnapshot(cluster string, canaries ...string) *relaypb.Snapshot {
	in := fleet.SnapshotSpec{}.Inputs(cluster)
	for _, name := range canaries {
		labels := map[string]string{"app": "canary-client", "canary": name}
		in.Deployments = append(in.Deployments, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps-0", Labels: labels},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{ServiceAccountName: "canary", Containers: []corev1.Container{{Name: "client", Image: "docker.io/curlimages/curl:8.8.0"}}}}},
		})
	}
	return discovery.Build(cluster, in)
}

// canaryPolicy is a TrafficPolicy whose sources are the workloads labelled
// app=canary-client, in any cluster: its status lists them as the
// server's translation finds them.
const canaryPolicy = "canary-clients"

// sources are the source workloads of canaryPolicy's status.
func (w *snapshotWorld) sources(t *testing.T) []string {
	t.Helper()
	tp, err := w.env.Mgmt.Dynamic.Resource(fleet.TrafficPolicies).Namespace(w.env.Mgmt.Namespace).Get(w.ctx, canaryPolicy, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	got, _, _ := unstructured.NestedStringSlice(tp.Object, "status", "workloads")
	slices.Sort(got)
	return got
}

// want is what canaryPolicy's status lists when the agents pushed
// w.canaries.
func (w *snapshotWorld) want() []string {
	var names []string
	for cluster, cs := range w.canaries {
		for _, c := range cs {
			names = append(names, deploymentName(cluster, "apps-0", c))
		}
	}
	slices.Sort(names)
	return names
}

// push makes cluster's agent push its canaries.
func (w *snapshotWorld) push(cluster string, canaries ...string) {
	w.canaries[cluster] = canaries
	w.agents[cluster].SetSnapshot(canarySnapshot(cluster, canaries...))
}

// waitSources waits until canaryPolicy's status lists exactly the
// canaries pushed.
func (w *snapshotWorld) waitSources(t *testing.T, what string) {
	t.Helper()
	want := w.want()
	Eventually(t, 90*time.Second, what, func() (bool, string) {
		got := w.sources(t)
		return slices.Equal(got, want), fmt.Sprintf("want %v, got %v", want, got)
	})
}

// afterMarker waits until canaryPolicy's status lists cluster-1's canary
// marker — pushed after the tampering, so the server has handled the
// tampering once the marker is in translation (Redis delivers messages in
// order) — and checks that it then lists exactly the canaries pushed.
func (w *snapshotWorld) afterMarker(t *testing.T, marker, what string) {
	t.Helper()
	name := deploymentName("cluster-1", "apps-0", marker)
	Eventually(t, 90*time.Second, "the marker "+marker+" in translation", func() (bool, string) {
		got := w.sources(t)
		return slices.Contains(got, name), fmt.Sprint(got)
	})
	assert.Equal(t, w.want(), w.sources(t), what)
}

// holdSources checks, for d, that canaryPolicy's status keeps listing
// exactly the canaries pushed.
func (w *snapshotWorld) holdSources(t *testing.T, d time.Duration, what string) {
	t.Helper()
	want := w.want()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := w.sources(t); !slices.Equal(got, want) {
			t.Errorf("%s: want %v, got %v", what, want, got)
			return
		}
	}
}

// keyedStore reads Redis as a replica does, with the replicas' key.
func (w *snapshotWorld) keyedStore(t *testing.T) *snapshots.Store {
	t.Helper()
	if w.store != nil {
		return w.store
	}
	sec, err := w.env.Mgmt.Kube.CoreV1().Secrets(w.env.Mgmt.Namespace).Get(w.ctx, "relay-snapshot-key-secret", metav1.GetOptions{})
	require.NoError(t, err)
	w.store, err = snapshots.New(snapshots.Config{Address: w.redis.Address(), Password: w.redis.Password(), TLS: w.redis.TLS(), Key: sec.Data["key"]})
	require.NoError(t, err)
	w.t.Cleanup(func() { _ = w.store.Close() })
	return w.store
}

// stored waits until Redis holds a record of cluster that verifies with
// the replicas' key and carries hash.
func (w *snapshotWorld) stored(t *testing.T, cluster, hash, what string) {
	t.Helper()
	store := w.keyedStore(t)
	Eventually(t, 30*time.Second, what, func() (bool, string) {
		// The store has read the records before: an older one written back
		// is refused (ErrReplayed) until the server writes the current one
		// again.
		rec, _, err := store.Get(w.ctx, cluster)
		if err != nil {
			return false, err.Error()
		}
		return rec.Snapshot.GetHash() == hash, rec.Snapshot.GetHash()
	})
}

// A bare PUBLISH of a delete announcement for cluster-2 (no record
// touched, no key) removes none of its workloads from translation; nor
// does deleting its record from Redis as well: the server keeps its last
// verified workloads, and writes the record again.
func (w *snapshotWorld) forgedAnnouncement(t *testing.T) {
	members := w.register(t, "cluster-1", "cluster-2")
	w.canaries = map[string][]string{"cluster-2": {"canary-a", "canary-b"}}
	// They push for the rest of the test (ReplayedRecord too).
	w.agents["cluster-1"] = w.agent(w.t, members[0], canarySnapshot("cluster-1"))
	w.agents["cluster-2"] = w.agent(w.t, members[1], canarySnapshot("cluster-2", "canary-a", "canary-b"))
	_, err := w.env.Cluster.Apply(w.ctx, "test", []byte(fmt.Sprintf(`apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: %s, namespace: %s}
spec:
  sourceSelector: [{labels: {app: canary-client}}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: svc-0, namespace: apps-0, clusterName: cluster-1}]
  policy:
    retries: {attempts: 2}
`, canaryPolicy, w.env.Mgmt.Namespace)))
	require.NoError(t, err)
	w.waitSources(t, "cluster-2's canaries in translation")

	require.NoError(t, w.raw.Publish(w.ctx, "relaymesh:snapshots", "del cluster-2").Err())
	// Announcements are handled in order: once a later change of cluster-1
	// is in translation, the forged one was handled.
	w.push("cluster-1", "marker-1")
	w.afterMarker(t, "marker-1", "cluster-2's canaries are still in translation after a forged delete announcement")
	w.holdSources(t, 3*time.Second, "after a forged delete announcement")

	require.NoError(t, w.raw.Del(w.ctx, "relaymesh:snapshot:cluster-2").Err())
	require.NoError(t, w.raw.Publish(w.ctx, "relaymesh:snapshots", "del cluster-2").Err())
	w.push("cluster-1", "marker-1", "marker-2")
	w.afterMarker(t, "marker-2", "cluster-2's canaries are still in translation after its record was deleted and the delete announced")
	w.stored(t, "cluster-2", canarySnapshot("cluster-2", "canary-a", "canary-b").GetHash(), "the server wrote cluster-2's record again")
	w.holdSources(t, 3*time.Second, "after its record was deleted")
}

// An older, genuine record of cluster-2 (with workloads it no longer has)
// written back to Redis and announced does not bring the workloads back
// into translation; the server writes the current record again.
func (w *snapshotWorld) replayedRecord(t *testing.T) {
	require.NotNil(t, w.agents["cluster-2"], "runs after ForgedAnnouncement, in its world")
	w.push("cluster-2", "canary-a", "canary-b", "canary-c")
	w.waitSources(t, "cluster-2's three canaries in translation")
	oldHash := canarySnapshot("cluster-2", "canary-a", "canary-b", "canary-c").GetHash()
	w.stored(t, "cluster-2", oldHash, "the record of three canaries in Redis")
	old, err := w.raw.HGet(w.ctx, "relaymesh:snapshot:cluster-2", "rec").Result()
	require.NoError(t, err)
	w.push("cluster-2", "canary-a")
	w.waitSources(t, "canary-b and canary-c removed")
	current := canarySnapshot("cluster-2", "canary-a").GetHash()
	w.stored(t, "cluster-2", current, "the current record in Redis")

	at := fmt.Sprint(time.Now().UnixMicro())
	require.NoError(t, w.raw.HSet(w.ctx, "relaymesh:snapshot:cluster-2", "rec", old, "at", at, "hash", oldHash).Err())
	require.NoError(t, w.raw.Publish(w.ctx, "relaymesh:snapshots", strings.Join([]string{"put", at, oldHash, "cluster-2"}, " ")).Err())
	w.push("cluster-1", "marker-1", "marker-2", "marker-3")
	w.afterMarker(t, "marker-3", "canary-b and canary-c did not come back after the replay")
	w.holdSources(t, 3*time.Second, "after the replay")
	w.stored(t, "cluster-2", current, "the server wrote the current record again")
}
