package app_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The tasks of the once-only table each setup has (server/app once.go).
var (
	singleTasks = []string{"orphan-collection", "relay-issuer-renewal", "relay-root-rotation", "spent-token-collection", "spiffe-import", "status-and-rotation", "token-mint-audit"}
	haTasks     = []string{"ack-ledger-collection", "orphan-collection", "output-heads", "relay-issuer-renewal", "relay-root-rotation", "replica-lease-collection", "serving-secret", "session-sweep",
		"spent-token-collection", "spiffe-import", "status-and-rotation", "token-mint-audit"}
	// The tasks that run for the whole term (orphan-collection and
	// ack-ledger-collection do one pass and return).
	haTermTasks = []string{"output-heads", "relay-issuer-renewal", "relay-root-rotation", "replica-lease-collection", "serving-secret", "session-sweep", "spent-token-collection", "spiffe-import", "status-and-rotation", "token-mint-audit"}
)

// The whole server — app.Run's assembly, in-process, on one local
// apiserver — runs its once-only table: the only replica runs every task
// itself; of three replicas only the Lease holder runs them, they move
// when it dies, every replica keeps its own heartbeat Lease, and the relay
// CA is generated once and shared.
func TestTheWholeServerRunsEachOnceOnlyTaskOnOneReplicaAtATime(t *testing.T) {
	kube := apptest.Management(t, "single")
	t.Run("the only replica runs its once-only work itself, without Leases", func(t *testing.T) {
		testOnlyReplica(t, kube, "single")
	})
	t.Run("of three replicas only the Lease holder runs the once-only work, and it moves when the holder dies", func(t *testing.T) {
		_, err := kube.Typed.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ha"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		testThreeReplicas(t, kube, "ha")
	})
}

func testOnlyReplica(t *testing.T, kube *kubeclient.Clients, ns string) {
	ctx := context.Background()
	cfg := apptest.AppConfig(t, ns, "")
	cfg.LeaderElect = false
	// Token records minted long ago: one expired a retention ago (the
	// token collection deletes it at once), one expired an hour ago and
	// one still valid (both kept).
	store, err := identity.NewKubeTokenStore(kube.Typed, ns)
	require.NoError(t, err)
	mint := func(at time.Time, ttl time.Duration) identity.TokenRecord {
		tokens, err := identity.NewTokens(identity.TokensConfig{Store: store, Clock: func() time.Time { return at }})
		require.NoError(t, err)
		_, rec, err := tokens.Mint(ctx, "cluster-1", ttl)
		require.NoError(t, err)
		return rec
	}
	stale := mint(time.Now().Add(-identity.ExpiredRetention-2*time.Hour), time.Hour)
	expired := mint(time.Now().Add(-2*time.Hour), time.Hour)
	valid := mint(time.Now(), time.Hour)
	a := apptest.StartApp(t, kube, cfg)
	require.Eventually(t, func() bool {
		_, err := store.GetLatest(ctx, stale.ID)
		return errors.Is(err, identity.ErrTokenNotFound)
	}, 30*time.Second, 200*time.Millisecond, "the record of a token expired unspent a retention ago is collected")
	for _, rec := range []identity.TokenRecord{expired, valid} {
		_, err := store.GetLatest(ctx, rec.ID)
		assert.NoError(t, err, "expires %s: kept", rec.ExpiresAt)
	}
	require.Eventually(t, func() bool {
		starts := a.Series(t, app.MetricOnceOnlyStarts, "task")
		return slices.Equal(sortedKeys(starts), singleTasks) && allEqual(starts, 1)
	}, time.Minute, 200*time.Millisecond, "every task of the single-replica table starts once: %v", a.Series(t, app.MetricOnceOnlyStarts, "task"))
	running := a.Series(t, app.MetricOnceOnlyRunning, "task")
	assert.Equal(t, 1.0, running["token-mint-audit"])
	assert.Equal(t, 1.0, running["status-and-rotation"])
	// The only replica writes its serving secret itself, at once.
	require.Eventually(t, func() bool {
		_, err := kube.Typed.CoreV1().Secrets(ns).Get(ctx, "relay-server-tls-secret", metav1.GetOptions{})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)
	leases, err := kube.Typed.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, leases.Items, "the only replica neither elects nor heartbeats")
	roots := relayRoots(t, kube, ns)
	assertServesFrom(t, a.Addrs.Relay, roots)
	assertOpsServeTLS(t, a.Addrs.Metrics, roots)
	require.NoError(t, a.Stop())
}

func testThreeReplicas(t *testing.T, kube *kubeclient.Clients, ns string) {
	ctx := context.Background()
	apps := map[string]*apptest.App{}
	for i := range 3 {
		name := fmt.Sprintf("replica-%d", i)
		apps[name] = apptest.LaunchApp(t, kube, apptest.AppConfig(t, ns, name))
	}
	for _, a := range apps {
		a.WaitServing(t)
	}
	holder := waitForOneLeader(t, kube, ns, apps)
	// In a steady state every task has run exactly once per term, on the
	// holder only.
	for name, a := range apps {
		starts, terms := a.Series(t, app.MetricOnceOnlyStarts, "task"), a.Series(t, "relaymesh_server_leader_terms_total", "")[""]
		assert.Equal(t, haTasks, sortedKeys(starts), "%s has the table's tasks for several replicas", name)
		for _, task := range haTasks {
			assert.Equal(t, terms, starts[task], "%s started %s once in each of its terms", name, task)
		}
	}
	for range 5 {
		assertOnlyHolderRuns(t, apps, holder)
		time.Sleep(200 * time.Millisecond)
	}
	// Every replica has its own heartbeat Lease.
	require.Eventually(t, func() bool {
		return slices.Equal(replicaLeases(t, kube, ns), []string{"replica-0", "replica-1", "replica-2"})
	},
		30*time.Second, 200*time.Millisecond, "one heartbeat Lease per replica")
	// The relay CA was generated once: every replica serves a certificate
	// from the one root in relay-root-tls-secret.
	roots := relayRoots(t, kube, ns)
	for _, a := range apps {
		assertServesFrom(t, a.Addrs.Relay, roots)
	}
	_, err := kube.Typed.CoreV1().Secrets(ns).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
	require.NoError(t, err)

	// The holder dies: the work moves to one of the others, and its
	// heartbeat Lease goes with it.
	require.NoError(t, apps[holder].Stop())
	dead := holder
	delete(apps, dead)
	holder = waitForOneLeader(t, kube, ns, apps)
	assert.NotEqual(t, dead, holder)
	for _, task := range haTasks {
		starts := apps[holder].Series(t, app.MetricOnceOnlyStarts, "task")
		assert.GreaterOrEqual(t, starts[task], 1.0, "the new holder started %s", task)
	}
	assertOnlyHolderRuns(t, apps, holder)
	require.Eventually(t, func() bool { return !slices.Contains(replicaLeases(t, kube, ns), dead) },
		30*time.Second, 200*time.Millisecond, "a stopped replica deletes its heartbeat Lease")
}

// waitForOneLeader waits until the Lease's holder is one of apps and runs
// every task of a term, and the others run none; it returns the holder.
func waitForOneLeader(t *testing.T, kube *kubeclient.Clients, ns string, apps map[string]*apptest.App) string {
	t.Helper()
	var holder, why string
	ok := assert.Eventually(t, func() bool {
		l, err := kube.Typed.CoordinationV1().Leases(ns).Get(context.Background(), leader.ServerLease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || apps[*l.Spec.HolderIdentity] == nil {
			why = fmt.Sprintf("no live replica holds the Lease (%v)", err)
			return false
		}
		holder = *l.Spec.HolderIdentity
		why = onlyHolderRuns(t, apps, holder)
		return why == ""
	}, 2*time.Minute, 200*time.Millisecond, "one replica holds the Lease and runs the once-only work")
	require.True(t, ok, "last seen: %s", why)
	return holder
}

func assertOnlyHolderRuns(t *testing.T, apps map[string]*apptest.App, holder string) {
	t.Helper()
	assert.Empty(t, onlyHolderRuns(t, apps, holder))
}

// onlyHolderRuns says what breaks "the holder runs every term task, no
// other replica runs any" ("" if nothing).
func onlyHolderRuns(t *testing.T, apps map[string]*apptest.App, holder string) string {
	for name, a := range apps {
		running := a.Series(t, app.MetricOnceOnlyRunning, "task")
		for _, task := range haTermTasks {
			want := 0.0
			if name == holder {
				want = 1
			}
			if running[task] != want {
				return fmt.Sprintf("%s runs %s: %v, want %v", name, task, running[task], want)
			}
		}
	}
	return ""
}

// replicaLeases are the replicas with a heartbeat Lease, sorted.
func replicaLeases(t *testing.T, kube *kubeclient.Clients, ns string) []string {
	list, err := kube.Typed.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{LabelSelector: leader.ReplicaLabel + "=true"})
	require.NoError(t, err)
	var names []string
	for _, l := range list.Items {
		if l.Spec.HolderIdentity != nil {
			names = append(names, *l.Spec.HolderIdentity)
		}
	}
	sort.Strings(names)
	return names
}

// relayRoots are the roots in relay-root-tls-secret.
func relayRoots(t *testing.T, kube *kubeclient.Clients, ns string) *x509.CertPool {
	t.Helper()
	sec, err := kube.Typed.CoreV1().Secrets(ns).Get(context.Background(), ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(sec.Data["ca.crt"]), "relay-root-tls-secret holds the relay root")
	return pool
}

// assertServesFrom checks that the relay at addr serves a certificate for
// localhost that chains to roots.
func assertServesFrom(t *testing.T, addr string, roots *x509.CertPool) {
	t.Helper()
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second},
		Config: &tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}}
	conn, err := d.DialContext(context.Background(), "tcp", addr)
	require.NoError(t, err, "the relay at %s serves a certificate from the shared relay CA", addr)
	state := conn.(*tls.Conn).ConnectionState()
	assert.NotEmpty(t, state.VerifiedChains)
	_ = conn.Close()
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func allEqual(m map[string]float64, v float64) bool {
	for _, x := range m {
		if x != v {
			return false
		}
	}
	return true
}
