package ha_test

import (
	"crypto/x509"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/server/acks"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/ha"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Issue 22's goals for a replica's death.
const (
	// resyncGoal: every agent of a killed replica is connected to another
	// and holds its cluster's current outputs this soon after the kill.
	resyncGoal = 10 * time.Second
	// fleetAgents is how many in-process fleet agents run beside the two
	// real agents (and the four of the two deregistered clusters).
	fleetAgents = 20
	// failoverPolicy is the TrafficPolicy (no selectors: every Destination
	// of every cluster) whose request timeout each step edits.
	failoverPolicy = "failover"
	// trustMesh is the VirtualMesh with shared trust over the two real
	// clusters' meshes.
	trustMesh = "failover-trust"
)

// realClusters are the workload clusters (local kube-apiservers) with a real
// `relaymesh agent` each.
var realClusters = []string{"cluster-1", "cluster-2"}

var (
	kubernetesClusters = multiclusterv1alpha1.KubernetesClusters
	virtualServices    = outputs.VirtualServices
	timeoutField       = regexp.MustCompile(`"timeout":"([^"]+)"`)
)

// TestFailover is issue 22's HA end-to-end test: three replicas (each in its
// own network namespace), 20 fleet agents and 2 real `relaymesh agent`
// processes (each for a workload cluster with a real kube-apiserver), each
// given every replica's address, each cluster with outputs (a TrafficPolicy
// reaching every Destination; the real clusters also a VirtualMesh with
// shared trust). Then, each as a subtest: the replica holding the most
// sessions is SIGKILLed; the Lease holder is SIGKILLed; one replica is cut
// off from the apiserver; the store (the management kube-apiserver and etcd)
// is restarted; the leader is SIGKILLed in the middle of a root rotation.
// Throughout, no agent ever receives (fleet) or applies (real) an output
// version below one it had before.
func TestFailover(t *testing.T) {
	w := newWorld(t, false)
	t.Run("KillBusiest", w.killBusiest)
	t.Run("KillLeader", w.killLeader)
	t.Run("CutFromAPIServer", w.cutFromAPIServer)
	t.Run("RestartStore", w.restartStore)
	t.Run("RotationOverLeaderDeath", w.rotationOverLeaderDeath)
	t.Run("Monotonic", w.monotonic)
	w.env.VerifyAudit(t)
}

// killBusiest SIGKILLs the replica holding the most agent sessions.
func (w *world) killBusiest(t *testing.T) {
	w.failover(t, w.busiest(), w.victims["gone-1"])
}

// killLeader SIGKILLs the Lease holder.
func (w *world) killLeader(t *testing.T) {
	w.failover(t, w.waitLeader(t, nil), w.victims["gone-2"])
}

// failover SIGKILLs dead, edits the policy and deregisters vic's cluster
// right after, and checks: a new Lease holder within the lease (if dead
// held it); every agent that was on dead connected to another replica and
// holding its cluster's head within resyncGoal; the edit reaching every
// cluster; the deregistered cluster's sessions ended on every replica and
// its renewals refused. Then dead starts again.
func (w *world) failover(t *testing.T, dead *ha.Replica, vic *victim) {
	ctx := w.ctx
	moved := w.on(dead)
	require.NotEmpty(t, moved, "%s holds sessions", dead.Name)
	for _, a := range vic.agents {
		require.True(t, a.State().Connected, "%s's agents are connected before the kill", vic.cluster)
	}
	onDead := 0
	for _, a := range vic.agents {
		if w.env.ReplicaAt(a.State().Server) == dead {
			onDead++
		}
	}
	require.Equal(t, 1, onDead, "one of %s's agents is on %s", vic.cluster, dead.Name)
	for _, r := range w.env.Replicas {
		require.Equal(t, codes.OK, w.renew(r, vic.creds), "%s renews %s's certificate before the deregistration", r.Name, vic.cluster)
	}
	holder, err := w.env.LeaseHolder(ctx)
	require.NoError(t, err)
	wasLeader := holder == dead.Name
	lease, err := w.env.LeaseDuration(ctx)
	require.NoError(t, err)
	t.Logf("killing %s (Lease holder: %v; Lease held by %s), which holds %d of the tracked agents: %s; sessions per replica: %s",
		dead.Name, wasLeader, holder, len(moved), strings.Join(names(moved), " "), w.describeSessions())

	killAt := time.Now()
	require.NoError(t, dead.Kill())
	newLeader := w.watchLeader(dead, killAt)
	editAt := w.editPolicy(t)
	// The deregistration takes effect when the apiserver has committed the
	// deletion, which is before its answer: the revocation goal is counted
	// from the answer, and the call's own time is reported.
	delSent := time.Now()
	require.NoError(t, w.dyn.Resource(kubernetesClusters).Namespace(w.env.Namespace).Delete(ctx, vic.cluster, metav1.DeleteOptions{}))
	delAt := time.Now()
	t.Logf("policy edited to %s %s after the kill; %s deregistered %s after it (the delete call took %s)",
		w.want(), editAt.Sub(killAt).Round(time.Millisecond), vic.cluster, delAt.Sub(killAt).Round(time.Millisecond), delAt.Sub(delSent).Round(time.Millisecond))

	// The dead replica's agents are served by the others within the goal.
	// Without a leader the edit cannot be published yet (heads have one
	// author), so what they must hold then is the head as it was.
	resync := w.waitSynced(t, killAt, moved, resyncGoal+5*time.Second, syncOpts{edit: !wasLeader, avoid: dead})
	t.Logf("kill → each of %s's agents connected to another replica and holding its cluster's head%s (max %s): %s",
		dead.Name, map[bool]string{true: " with the edit", false: ""}[!wasLeader], maxOf(resync).Round(time.Millisecond), describe(resync))
	for _, a := range moved {
		switch d := resync[a.name]; {
		case d > resyncGoal:
			t.Errorf("%s resynced %s after the kill of %s, over the %s goal; %s", a.name, d.Round(time.Millisecond), dead.Name, resyncGoal, w.history(a, killAt))
		case d > resyncGoal/2:
			t.Logf("%s resynced %s after the kill, over half the goal; %s", a.name, d.Round(time.Millisecond), w.history(a, killAt))
		}
	}

	// The Lease moves within its duration and a bit: the dead holder's
	// last renewal preceded the kill by up to a retry period (1 s), the
	// others look once a retry period, and this machine is shared.
	if wasLeader {
		leader, after := newLeader(t)
		t.Logf("new Lease holder %s %s after the kill (lease %s)", leader.Name, after.Round(time.Millisecond), lease)
		assert.LessOrEqual(t, after, lease+5*time.Second, "a new Lease holder within the lease duration")
	}

	// The edit made right after the kill reaches every cluster.
	limit := resyncGoal + 5*time.Second
	if wasLeader {
		limit += lease
	}
	edit := w.waitSynced(t, editAt, w.agents, limit, syncOpts{edit: true})
	t.Logf("edit → every cluster holds it (max %s): %s", maxOf(edit).Round(time.Millisecond), describe(edit))

	// The deregistration ended the cluster's sessions on every replica and
	// is refused by each.
	w.checkDeregistered(t, vic, delSent, delAt, dead)

	// The dead replica comes back, serves, and refuses the deregistered
	// cluster as well.
	require.NoError(t, dead.Start())
	e2e.Eventually(t, 30*time.Second, dead.Name+" serves again after its restart", func() (bool, string) {
		c := w.renew(dead, w.probe)
		return c == codes.OK, c.String()
	})
	assert.Equal(t, codes.PermissionDenied, w.renew(dead, vic.creds), "restarted %s renews deregistered %s", dead.Name, vic.cluster)
	w.checkStatuses(t)
}

// checkDeregistered checks vic's agents: the one on a live replica saw its
// session end within revocationGoal of the deletion's answer (delAt; the
// delete was sent at delSent), the one that was on
// dead is refused when it reconnects, and every live replica refuses the
// cluster's renewals.
func (w *world) checkDeregistered(t *testing.T, vic *victim, delSent, delAt time.Time, dead *ha.Replica) {
	t.Helper()
	e2e.Eventually(t, 10*time.Second, vic.cluster+"'s agents refused", func() (bool, string) {
		var states []string
		all := true
		for _, a := range vic.agents {
			st := a.State()
			all = all && st.Refused != nil && !st.Connected
			states = append(states, fmt.Sprintf("connected %v to %s, refused %v, last error %v", st.Connected, st.Server, st.Refused, st.LastError))
		}
		return all, strings.Join(states, "; ")
	})
	var report []string
	for i, a := range vic.agents {
		end, ok := w.log.firstEnd(a, delSent)
		require.True(t, ok, "%s agent %d's session ended", vic.cluster, i)
		d := max(end.at.Sub(delAt), 0)
		report = append(report, fmt.Sprintf("agent %d: %s (%s)", i, d.Round(time.Millisecond), status.Code(end.err)))
		// The agent whose session was on dead had none open to end: it
		// is refused when it reconnects (checked above), after its
		// backoff.
		wasOnDead := dead != nil && w.env.ReplicaAt(w.log.lastOpened(a, delSent)) == dead
		if w.env.ReplicaAt(end.server) != dead && !wasOnDead {
			assert.LessOrEqual(t, d, revocationGoal, "%s's session on %s ended within the goal after the deregistration", vic.cluster, end.server)
		}
	}
	t.Logf("deregistration of %s → its sessions ended: %s", vic.cluster, strings.Join(report, ", "))
	for _, r := range w.env.Replicas {
		if r == dead {
			continue
		}
		var code codes.Code
		e2e.Eventually(t, 5*time.Second, r.Name+" refuses "+vic.cluster+"'s renewals", func() (bool, string) {
			code = w.renew(r, vic.creds)
			return code == codes.PermissionDenied, code.String()
		})
	}
}

// checkStatuses checks that every cluster's KubernetesCluster status says
// connected, on the replica the agent's session is on (fleet agents know
// theirs), with the agent's last ack at the cluster's head.
func (w *world) checkStatuses(t *testing.T) {
	t.Helper()
	start := time.Now()
	e2e.Eventually(t, 30*time.Second, "KubernetesCluster statuses of every cluster right", func() (bool, string) {
		heads, err := w.env.Heads(w.ctx)
		if err != nil {
			return false, err.Error()
		}
		recorded, err := acks.Read(w.ctx, w.env.Kube, w.env.Namespace)
		if err != nil {
			return false, err.Error()
		}
		for _, a := range w.agents {
			kc, err := w.cluster(a.cluster)
			if err != nil {
				return false, err.Error()
			}
			st := kc.Status
			// What the agent acked last: the ack ledger's record, or the
			// status's when later (the status takes a version-only ack
			// with the heartbeat).
			var acked uint64
			if st.AppliedOutputs != nil {
				acked, _ = strconv.ParseUint(st.AppliedOutputs.Version, 10, 64)
			}
			acked = max(acked, recorded[a.cluster].Version)
			ok := st.Connected && st.Replica != "" && acked == heads[a.cluster]
			if ok && a.fleet != nil {
				ok = st.Replica == w.replicaOf(a)
			}
			if !ok {
				hist := ""
				if a.fleet != nil {
					hist = "; its sessions: " + w.log.history(a.fleet, time.Now().Add(-2*time.Minute))
				}
				return false, fmt.Sprintf("%s: connected %v, replica %q (agent on %q), acked %d, head %d%s", a.cluster, st.Connected, st.Replica, w.replicaOf(a), acked, heads[a.cluster], hist)
			}
		}
		return true, ""
	})
	t.Logf("KubernetesCluster statuses right (connected, the session's replica, the ack at the head) %s after the check began", time.Since(start).Round(time.Millisecond))
}

// cutFromAPIServer cuts the replica holding the most sessions off from the
// apiserver: its agents move to the others within the lease and the goal;
// it refuses calls while cut; a policy edit during the cut reaches every
// cluster; after the restore it serves again and nothing was lost.
func (w *world) cutFromAPIServer(t *testing.T) {
	cut := w.busiest()
	moved := w.on(cut)
	require.NotEmpty(t, moved)
	for _, r := range w.env.Replicas {
		require.Equal(t, codes.OK, w.renew(r, w.probe), "%s serves before the cut", r.Name)
	}
	holder, err := w.env.LeaseHolder(w.ctx)
	require.NoError(t, err)
	t.Logf("cutting %s (Lease holder: %v) off from the apiserver; it holds %d tracked agents; sessions: %s",
		cut.Name, holder == cut.Name, len(moved), w.describeSessions())
	cutAt := time.Now()
	require.NoError(t, w.env.Net.CutAPIServer(cut.Index))
	t.Cleanup(func() {
		if w.env.Net.IsCut(cut.Index) {
			assert.NoError(t, w.env.Net.RestoreAPIServer(cut.Index))
		}
	})

	isolation, err := w.env.ReplicaLeaseDuration(w.ctx, cut.Name)
	require.NoError(t, err)
	goal := isolation + resyncGoal
	resync := w.waitSynced(t, cutAt, moved, goal+5*time.Second, syncOpts{avoid: cut})
	t.Logf("cut → each of %s's agents on another replica holding its head (its Lease lasts %s; max %s): %s", cut.Name, isolation, maxOf(resync).Round(time.Millisecond), describe(resync))
	for name, d := range resync {
		assert.LessOrEqual(t, d, goal, "%s moved off the cut replica", name)
	}

	// While cut it refuses calls and says it is not ready.
	e2e.Eventually(t, 5*time.Second, "the cut replica refuses calls", func() (bool, string) {
		c := w.renew(cut, w.probe)
		return c == codes.Unavailable, c.String()
	})
	code, err := e2e.GetJSON("https://"+cut.OpsAddr+"/readyz", nil)
	require.NoError(t, err)
	assert.Equal(t, 503, code, "the cut replica's /readyz")
	n, err := cut.Metric(ha.MetricConnectedAgents)
	require.NoError(t, err)
	assert.Zero(t, n, "the cut replica holds no session")

	// An edit during the cut reaches every cluster through the others.
	editAt := w.editPolicy(t)
	edit := w.waitSynced(t, editAt, w.agents, goal, syncOpts{edit: true, avoid: cut})
	t.Logf("edit during the cut → every cluster (max %s)", maxOf(edit).Round(time.Millisecond))
	if holder == cut.Name {
		leader := w.waitLeader(t, cut)
		t.Logf("the Lease moved from the cut %s to %s", cut.Name, leader.Name)
	}

	restoreAt := time.Now()
	require.NoError(t, w.env.Net.RestoreAPIServer(cut.Index))
	e2e.Eventually(t, 60*time.Second, "the restored replica to serve", func() (bool, string) {
		c := w.renew(cut, w.probe)
		code, err := e2e.GetJSON("https://"+cut.OpsAddr+"/readyz", nil)
		return c == codes.OK && err == nil && code == 200, fmt.Sprint(c, " ", code, err)
	})
	t.Logf("restore → %s answers calls and is ready again after %s (cut for %s)", cut.Name, time.Since(restoreAt).Round(time.Millisecond), restoreAt.Sub(cutAt).Round(time.Millisecond))

	// Nothing lost: every agent holds the head with a new edit, and the
	// statuses are right.
	editAt = w.editPolicy(t)
	w.waitSynced(t, editAt, w.agents, 2*resyncGoal, syncOpts{edit: true})
	w.checkStatuses(t)
}

// restartStore restarts the store (the management kube-apiserver and the
// etcd under it) and checks that everything converges: sessions, outputs,
// an edit made right after it returns, statuses, a Lease holder.
func (w *world) restartStore(t *testing.T) {
	before := w.describeSessions()
	down, err := w.env.RestartStore(w.ctx, true)
	require.NoError(t, err)
	t.Logf("store (kube-apiserver and etcd) restarted: unreachable for %s; sessions before: %s; just after: %s", down.Round(time.Millisecond), before, w.describeSessions())
	var editAt time.Time
	e2e.Eventually(t, 30*time.Second, "the policy edit after the store returned", func() (bool, string) {
		err := w.mgmt.SetRequestTimeout(w.ctx, failoverPolicy, fmt.Sprintf("%ds", w.timeout+1))
		if err == nil {
			w.timeout++
			editAt = time.Now()
		}
		return err == nil, fmt.Sprint(err)
	})
	edit := w.waitSynced(t, editAt, w.agents, 60*time.Second, syncOpts{edit: true})
	t.Logf("edit after the store's return → every cluster (max %s): %s", maxOf(edit).Round(time.Millisecond), describe(edit))
	leader := w.waitLeader(t, nil)
	for _, r := range w.env.Replicas {
		e2e.Eventually(t, 30*time.Second, r.Name+" serves after the store's restart", func() (bool, string) {
			c := w.renew(r, w.probe)
			return c == codes.OK, c.String()
		})
	}
	w.checkStatuses(t)
	t.Logf("after the store's restart: Lease held by %s; sessions: %s", leader.Name, w.describeSessions())
}

// rotationOverLeaderDeath rotates the shared root of the real clusters'
// meshes (MultiRoot, Manual verification) and SIGKILLs the Lease holder
// right after a continue: the rotation finishes, and both clusters' cacerts
// carry only the new root.
func (w *world) rotationOverLeaderDeath(t *testing.T) {
	vm := w.env.Namespace + "/" + trustMesh
	mgmtKube := w.env.Mgmt.Kubeconfig
	workloads := map[string]*trustState{}
	e2e.Eventually(t, 60*time.Second, "cacerts with one shared root in both clusters", func() (bool, string) {
		for _, name := range realClusters {
			st, err := w.trustOf(name)
			if err != nil {
				return false, name + ": " + err.Error()
			}
			workloads[name] = st
		}
		a, b := workloads[realClusters[0]], workloads[realClusters[1]]
		return len(a.roots) == 1 && len(b.roots) == 1 && a.roots[0].Equal(b.roots[0]), "roots differ"
	})
	oldRoot := workloads[realClusters[0]].roots[0]

	out, err := w.env.Run(t, "ca", "rotate", "start", vm, "--kubeconfig", mgmtKube, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, "AddingNewRoot step 1 (awaiting continue)")
	leader := w.waitLeader(t, nil)
	out, err = w.env.Run(t, "ca", "rotate", "continue", vm, "--kubeconfig", mgmtKube)
	require.NoError(t, err, out)
	killAt := time.Now()
	require.NoError(t, leader.Kill())
	newLeader := w.watchLeader(leader, killAt)
	t.Logf("rotation continued to PropagatingNewIntermediate; killed the Lease holder %s right after", leader.Name)
	var status string
	e2e.Eventually(t, time.Minute, "the rotation to reach PropagatingNewIntermediate awaiting continue", func() (bool, string) {
		status, err = w.env.Run(t, "ca", "status", vm, "--kubeconfig", mgmtKube)
		return err == nil && strings.Contains(status, "PropagatingNewIntermediate step 2") && strings.Contains(status, "awaiting"), status
	})
	next, after := newLeader(t)
	t.Logf("kill → the rotation waits in PropagatingNewIntermediate again %s after the kill (%s took the Lease %s after it)",
		time.Since(killAt).Round(time.Millisecond), next.Name, after.Round(time.Millisecond))
	out, err = w.env.Run(t, "ca", "rotate", "continue", vm, "--kubeconfig", mgmtKube, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, "DeletingOldRoot step 3 (awaiting continue)")
	out, err = w.env.Run(t, "ca", "rotate", "continue", vm, "--kubeconfig", mgmtKube, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, "Finished step 3")
	status, err = w.env.Run(t, "ca", "status", vm, "--kubeconfig", mgmtKube)
	require.NoError(t, err)
	assert.Contains(t, status, "ROTATION Finished", status)

	e2e.Eventually(t, 30*time.Second, "both clusters' cacerts to carry only the new root", func() (bool, string) {
		var first *trustState
		for _, name := range realClusters {
			st, err := w.trustOf(name)
			if err != nil {
				return false, name + ": " + err.Error()
			}
			if len(st.roots) != 1 || st.roots[0].Equal(oldRoot) {
				return false, fmt.Sprintf("%s: %d roots, the old one among them: %v", name, len(st.roots), slices.ContainsFunc(st.roots, oldRoot.Equal))
			}
			if first != nil && !first.roots[0].Equal(st.roots[0]) {
				return false, "the clusters' roots differ"
			}
			if err := st.verify(); err != nil {
				return false, name + ": " + err.Error()
			}
			first = st
		}
		return true, ""
	})
	t.Logf("rotation finished %s after the Lease holder's death; both clusters' cacerts carry only the new root", time.Since(killAt).Round(time.Millisecond))
	require.NoError(t, leader.Start())
}

// monotonic checks that no agent ever received (fleet) or applied (real) an
// output version below one it had before.
func (w *world) monotonic(t *testing.T) {
	all := slices.Clone(w.agents)
	for _, v := range w.victims {
		for i, a := range v.agents {
			all = append(all, &tracked{name: fmt.Sprintf("%s agent %d", v.cluster, i), cluster: v.cluster, fleet: a})
		}
	}
	total, skippedAll := 0, 0
	for _, a := range all {
		var versions []uint64
		if a.fleet != nil {
			versions = w.log.versions(a.fleet)
			assert.Zero(t, a.fleet.State().Regressions, "%s: output sets older than the one it acked", a.name)
		} else {
			var skipped int
			var err error
			versions, skipped, err = a.real.AppliedVersions()
			require.NoError(t, err)
			skippedAll += skipped
		}
		require.NotEmpty(t, versions, a.name)
		total += len(versions)
		for i := 1; i < len(versions); i++ {
			assert.GreaterOrEqual(t, versions[i], versions[i-1], "%s: version %d after %d", a.name, versions[i], versions[i-1])
		}
	}
	t.Logf("%d output sets received or applied by %d agents, none older than one before; the real agents skipped %d older sets a replica sent", total, len(all), skippedAll)
}

// trustState is a workload cluster's cacerts: its root bundle and
// intermediate.
type trustState struct {
	roots []*x509.Certificate
	inter *x509.Certificate
}

func (w *world) trustOf(cluster string) (*trustState, error) {
	cs, err := w.env.Local.Cluster(cluster).Clientset()
	if err != nil {
		return nil, err
	}
	s, err := cs.CoreV1().Secrets("istio-system").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	roots, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyRootCert])
	if err != nil {
		return nil, err
	}
	inter, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
	if err != nil {
		return nil, err
	}
	return &trustState{roots: roots, inter: inter}, nil
}

// verify checks the intermediate chains to the bundle.
func (s *trustState) verify() error {
	pool := x509.NewCertPool()
	for _, r := range s.roots {
		pool.AddCert(r)
	}
	_, err := s.inter.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
