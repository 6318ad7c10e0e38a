package ha_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/ha"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
)

// revocationGoal is how soon after a deregistration every replica must have
// ended the cluster's sessions (issue 22; DESIGN.md's security defaults).
const revocationGoal = time.Second

// TestRevocationOnEveryReplica runs two agent processes of one cluster,
// connected to two different replicas, deregisters the cluster with
// `relaymesh cluster deregister`, and measures how long it takes until
// both replicas have ended its sessions and both agents have seen their
// streams end; then the cluster's certificate is refused for renewal by
// every replica.
func TestRevocationOnEveryReplica(t *testing.T) {
	ctx := context.Background()
	env := ha.Setup(t, bin, ha.Config{Replicas: 3, Workloads: []string{"cluster-1"}})
	env.Start(t)
	r0, r1 := env.Replicas[0], env.Replicas[1]
	_, err := env.Run(t, "cluster", "register", "cluster-1", "--mgmt-kubeconfig", env.Mgmt.Kubeconfig, "--namespace", env.Namespace,
		"--remote-kubeconfig", env.Local.Cluster("cluster-1").Kubeconfig, "--server-address", r0.RelayAddr)
	require.NoError(t, err)
	// Two agents of cluster-1 (no leader election): one bootstraps through
	// replica 0, the other then connects to replica 1 with the stored
	// certificate, through the Service name.
	agents := []*ha.Agent{env.StartAgent(t, "agent-a", "cluster-1")}
	serial := waitConnected(t, agents[0], "cluster-1")
	agents = append(agents, env.StartAgent(t, "agent-b", "cluster-1", "--server-address", r1.RelayAddr, "--server-name", env.ServiceName()))
	assert.Equal(t, serial, waitConnected(t, agents[1], "cluster-1"))
	waitGauge(t, r0, 1)
	waitGauge(t, r1, 1)

	// The certificate both agents use, for the renewals at the end; before
	// the deregistration every replica renews it.
	workload, err := env.Local.Cluster("cluster-1").Clientset()
	require.NoError(t, err)
	sec, err := workload.CoreV1().Secrets("relaymesh").Get(ctx, "relay-client-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)
	renew := func(r *ha.Replica) error {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := ha.Dial(dctx, ha.ClientConfig{Addr: r.RelayAddr, ServerName: env.ServiceName(), Roots: sec.Data["ca.crt"],
			CertPEM: sec.Data["tls.crt"], KeyPEM: sec.Data["tls.key"]})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Renew(dctx)
		return err
	}
	for _, r := range env.Replicas {
		require.NoError(t, renew(r), "%s renews cluster-1's certificate while it is registered", r.Name)
	}

	// Watch for the deletion, and poll every observer of a session.
	dyn, err := dynamic.NewForConfig(env.Mgmt.RESTConfig())
	require.NoError(t, err)
	w, err := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(env.Namespace).
		Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=cluster-1"})
	require.NoError(t, err)
	defer w.Stop()
	deleted := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				deleted <- time.Now()
				return
			}
		}
	}()
	type observer struct {
		name  string
		ended func() (bool, error)
	}
	observers := []observer{
		{r0.Name + " sessions", func() (bool, error) { v, err := r0.Metric(ha.MetricConnectedAgents); return v == 0, err }},
		{r1.Name + " sessions", func() (bool, error) { v, err := r1.Metric(ha.MetricConnectedAgents); return v == 0, err }},
	}
	for _, a := range agents {
		observers = append(observers, observer{a.Name + " stream", func() (bool, error) { c, err := a.Connected(); return !c, err }})
	}
	for _, o := range observers {
		ended, err := o.ended()
		require.NoError(t, err)
		require.False(t, ended, "%s ended before the deregistration", o.name)
	}
	endedAt := make([]time.Time, len(observers))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, o := range observers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if ended, err := o.ended(); err == nil && ended {
					endedAt[i] = time.Now()
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
	}

	cliStart := time.Now()
	out, err := env.Run(t, "cluster", "deregister", "cluster-1", "--mgmt-kubeconfig", env.Mgmt.Kubeconfig, "--namespace", env.Namespace)
	require.NoError(t, err)
	assert.Contains(t, out, "deregistered cluster cluster-1")
	var deletedAt time.Time
	select {
	case deletedAt = <-deleted:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch never saw cluster-1 deleted")
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		close(stop)
		<-done
	}
	var last time.Time
	var report []string
	for i, o := range observers {
		if endedAt[i].IsZero() {
			t.Errorf("%s had not ended 10 s after the deregistration", o.name)
			continue
		}
		report = append(report, fmt.Sprintf("%s %s", o.name, endedAt[i].Sub(deletedAt).Round(time.Millisecond)))
		if endedAt[i].After(last) {
			last = endedAt[i]
		}
	}
	require.False(t, last.IsZero())
	fromDeletion, fromCommand := last.Sub(deletedAt), last.Sub(cliStart)
	t.Logf("revocation: every session of cluster-1 ended %s after its KubernetesCluster was deleted (%s after `cluster deregister` started); each, from the deletion: %s",
		fromDeletion.Round(time.Millisecond), fromCommand.Round(time.Millisecond), strings.Join(report, ", "))
	assert.LessOrEqual(t, fromDeletion, revocationGoal, "sessions on every replica end within %s of the deregistration", revocationGoal)

	// Every replica refuses the certificate now.
	for _, r := range env.Replicas {
		err := renew(r)
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%s: renewal after deregistration: %v", r.Name, err)
	}
	// And the agents say why.
	for _, a := range agents {
		e2e.Eventually(t, 10*time.Second, a.Name+" to report the refusal", func() (bool, string) {
			code, st, err := a.Status()
			return err == nil && code == 503 && strings.Contains(st.Error, "re-register the cluster"), fmt.Sprintf("%d %v %+v", code, err, st)
		})
	}
	denied := map[int]int{}
	for _, rec := range env.AuditRecords(t) {
		if rec.Cluster == "cluster-1" && rec.Type == "cert.deny" {
			denied[rec.Replica]++
		}
	}
	for _, r := range env.Replicas {
		assert.GreaterOrEqual(t, denied[r.Index], 1, "%s audited the refused renewal", r.Name)
	}
	env.VerifyAudit(t)
}
