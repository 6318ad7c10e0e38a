package ha_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/examples"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/ha"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
)

// world is the running environment of TestFailover.
type world struct {
	ctx     context.Context
	env     *ha.Env
	mgmt    *fleet.Management
	dyn     dynamic.Interface
	agents  []*tracked // every agent that must stay served
	log     *outputLog
	timeout int // the policy's current request timeout, in seconds
	// probe is a certificate of the registered cluster "probe" (no agent),
	// for calls that must be answered or refused.
	probe creds
	roots []byte // the relay roots (PEM)
	// victims are the clusters deregistered during a failure, by phase.
	victims map[string]*victim
	leader  *ha.Replica // the Lease holder when the agents started
	// canaries are the cluster/name of the workloads the canary policy
	// selects (TestFailoverWithRedis); fleetCanaries those of each fleet
	// cluster.
	canaries      []string
	fleetCanaries map[string][]string
}

// tracked is one agent: in-process (fleet) or a process (real).
type tracked struct {
	name, cluster string
	fleet         *fleet.Agent
	real          *ha.Agent
	workload      dynamic.Interface // real only: its cluster
}

// creds is a client certificate chain and key (PEM). Never logged.
type creds struct{ cert, key []byte }

// victim is a cluster deregistered during a failure: two fleet agents
// (one on the replica about to die, one on a replica that lives) and a
// certificate for renewals.
type victim struct {
	cluster string
	agents  []*fleet.Agent
	creds   creds
}

// outputLog records every output set and session of the fleet agents.
type outputLog struct {
	mu       sync.Mutex
	outputs  map[*fleet.Agent][]received
	sessions map[*fleet.Agent][]event
	ended    map[*fleet.Agent][]event
}

type received struct {
	version uint64
	at      time.Time
	server  string
	timeout string
}

type event struct {
	server string
	at     time.Time
	err    error
}

func (l *outputLog) hooks() fleet.Hooks {
	return fleet.Hooks{
		Output: func(a *fleet.Agent, o fleet.Output) {
			r := received{version: o.Version, at: o.At, server: o.Server, timeout: timeoutOf(o.Set)}
			l.mu.Lock()
			l.outputs[a] = append(l.outputs[a], r)
			l.mu.Unlock()
		},
		SessionOpened: func(a *fleet.Agent, server string, at time.Time) {
			l.mu.Lock()
			l.sessions[a] = append(l.sessions[a], event{server: server, at: at})
			l.mu.Unlock()
		},
		SessionEnded: func(a *fleet.Agent, server string, err error) {
			l.mu.Lock()
			l.ended[a] = append(l.ended[a], event{server: server, at: time.Now(), err: err})
			l.mu.Unlock()
		},
	}
}

// last is the newest output set a received, if any.
func (l *outputLog) last(a *fleet.Agent) (received, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.outputs[a]
	if len(o) == 0 {
		return received{}, false
	}
	return o[len(o)-1], true
}

// firstOutput is the first set of version v a received after t.
func (l *outputLog) firstOutput(a *fleet.Agent, v uint64, t time.Time) (received, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.outputs[a] {
		if o.version == v && o.at.After(t) {
			return o, true
		}
	}
	return received{}, false
}

// firstSession is the first session a opened after t.
func (l *outputLog) firstSession(a *fleet.Agent, t time.Time) (event, bool) {
	return l.firstAfter(l.sessions, a, t)
}

// firstEnd is the first session end of a after t.
func (l *outputLog) firstEnd(a *fleet.Agent, t time.Time) (event, bool) {
	return l.firstAfter(l.ended, a, t)
}

// lastOpened is the replica a's last session before t was opened on.
func (l *outputLog) lastOpened(a *fleet.Agent, t time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	server := ""
	for _, e := range l.sessions[a] {
		if e.at.Before(t) {
			server = e.server
		}
	}
	return server
}

func (l *outputLog) firstAfter(events map[*fleet.Agent][]event, a *fleet.Agent, t time.Time) (event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range events[a] {
		if e.at.After(t) {
			return e, true
		}
	}
	return event{}, false
}

// versions are the versions a received, in order.
func (l *outputLog) versions(a *fleet.Agent) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []uint64
	for _, o := range l.outputs[a] {
		out = append(out, o.version)
	}
	return out
}

// history is what fleet agent a went through after t: sessions opened and
// ended, output sets received (times from t).
func (l *outputLog) history(a *fleet.Agent, t time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, s := range l.sessions[a] {
		if s.at.After(t) {
			lines = append(lines, line{s.at, "opened on " + s.server})
		}
	}
	for _, s := range l.ended[a] {
		if s.at.After(t) {
			lines = append(lines, line{s.at, fmt.Sprintf("ended on %s (%s)", s.server, status.Code(s.err))})
		}
	}
	for _, o := range l.outputs[a] {
		if o.at.After(t) {
			lines = append(lines, line{o.at, fmt.Sprintf("version %d (timeout %s) from %s", o.version, o.timeout, o.server)})
		}
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	var out []string
	for _, l := range lines {
		out = append(out, fmt.Sprintf("+%s %s", l.at.Sub(t).Round(time.Millisecond), l.text))
	}
	return strings.Join(out, "; ")
}

// timeoutOf is the request timeout of the first route in set that has one.
func timeoutOf(set *relaypb.OutputSet) string {
	for _, o := range set.GetObjects() {
		if m := timeoutField.FindSubmatch(o.GetManifest()); m != nil {
			return string(m[1])
		}
	}
	return ""
}

// newWorld starts everything and waits until every agent holds its
// cluster's current outputs.
func newWorld(t *testing.T, redis bool) *world {
	ctx := context.Background()
	env := ha.Setup(t, bin, ha.Config{Replicas: 3, Workloads: realClusters, Redis: redis})
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	for _, name := range realClusters {
		_, err := env.Local.Cluster(name).Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		require.NoError(t, err)
	}
	setupStart := time.Now()
	env.Start(t)
	mgmt, err := fleet.NewManagement(ctx, env.Mgmt.RESTConfig(), env.Namespace)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(env.Mgmt.RESTConfig())
	require.NoError(t, err)
	w := &world{ctx: ctx, env: env, mgmt: mgmt, dyn: dyn, victims: map[string]*victim{}, fleetCanaries: map[string][]string{},
		log: &outputLog{outputs: map[*fleet.Agent][]received{}, sessions: map[*fleet.Agent][]event{}, ended: map[*fleet.Agent][]event{}}}
	w.editPolicy(t)
	vm := fmt.Sprintf(`apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: %s, namespace: %s}
spec:
  meshes:
  - {clusterName: cluster-1, namespace: istio-system, name: istiod}
  - {clusterName: cluster-2, namespace: istio-system, name: istiod}
  mtls:
    shared:
      rootCA: {generated: {ttl: 87600h}}
      intermediateOptions: {ttl: 8760h}
    rotationStrategy: MultiRoot
    rotationVerification: Manual
`, trustMesh, env.Namespace)
	_, err = env.Mgmt.Apply(ctx, "test", []byte(vm))
	require.NoError(t, err)

	// Place the agents so that a replica other than the leader holds the
	// most: half the fleet starts on it, a quarter on each other one.
	w.leader = w.waitLeader(t, nil)
	var busy, other *ha.Replica
	for _, r := range env.Replicas {
		switch {
		case r == w.leader:
		case busy == nil:
			busy = r
		default:
			other = r
		}
	}
	t.Logf("setup: %s holds the Lease; agents start mostly on %s", w.leader.Name, busy.Name)
	roots := env.Roots(t)
	w.roots = roots
	pool, err := mgmt.RelayRoots(ctx)
	require.NoError(t, err)

	names := fleet.ClusterNames("fleet", fleetAgents)
	members, err := mgmt.Register(ctx, append(append([]string{}, names...), "gone-1", "gone-2", "probe"), time.Hour, 4)
	require.NoError(t, err)
	tokens := map[string]string{}
	for _, m := range members {
		tokens[m.Cluster] = m.Token
	}
	newAgent := func(cluster, token string, servers []string) *fleet.Agent {
		src, err := env.Net.ClientAddr()
		require.NoError(t, err)
		a, err := fleet.NewAgent(fleet.AgentConfig{Cluster: cluster, Token: token, Source: src, Servers: servers,
			ServerName: env.ServiceName(), Roots: pool, Snapshot: fleet.SnapshotSpec{}.Snapshot(cluster),
			KeepOutputs: 4, Hooks: w.log.hooks()})
		require.NoError(t, err)
		a.Start(ctx)
		t.Cleanup(a.Stop)
		return a
	}
	for i, name := range names {
		first := busy
		switch i % 4 {
		case 1:
			first = w.leader
		case 3:
			first = other
		}
		a := newAgent(name, tokens[name], serverOrder(env, first, (i/4)%2 == 1))
		w.agents = append(w.agents, &tracked{name: name, cluster: name, fleet: a})
	}
	// The deregistered clusters: gone-1's agents on busy and other (busy
	// dies first), gone-2's on the leader and other (the leader dies
	// second); a third token of each gives the test a certificate.
	for _, v := range []struct {
		cluster     string
		first, live *ha.Replica
	}{{"gone-1", busy, other}, {"gone-2", w.leader, other}} {
		vic := &victim{cluster: v.cluster}
		second, err := mgmt.MintToken(ctx, v.cluster, time.Hour)
		require.NoError(t, err)
		vic.agents = append(vic.agents, newAgent(v.cluster, tokens[v.cluster], serverOrder(env, v.first, false)),
			newAgent(v.cluster, second, serverOrder(env, v.live, false)))
		third, err := mgmt.MintToken(ctx, v.cluster, time.Hour)
		require.NoError(t, err)
		vic.creds = w.bootstrap(t, v.live, v.cluster, third, roots)
		w.victims[v.cluster] = vic
	}
	w.probe = w.bootstrap(t, other, "probe", tokens["probe"], roots)

	// The real agents, both starting on busy.
	for i, name := range realClusters {
		_, err := env.Run(t, "cluster", "register", name, "--mgmt-kubeconfig", env.Mgmt.Kubeconfig, "--namespace", env.Namespace,
			"--remote-kubeconfig", env.Local.Cluster(name).Kubeconfig, "--server-address", busy.RelayAddr)
		require.NoError(t, err)
		servers := serverOrder(env, busy, i == 1)
		a := env.StartAgent(t, "agent-"+name, name, "--server-address", strings.Join(servers, ","), "--server-name", env.ServiceName())
		wd, err := dynamic.NewForConfig(env.Local.Cluster(name).RESTConfig())
		require.NoError(t, err)
		w.agents = append(w.agents, &tracked{name: a.Name, cluster: name, real: a, workload: wd})
	}
	synced := w.waitSynced(t, setupStart, w.agents, 120*time.Second, syncOpts{edit: true})
	t.Logf("setup: %d agents (%d fleet, %d real, 4 of deregistered-to-be clusters) hold their cluster's output head (timeout %s) %s after the replicas started",
		len(w.agents)+4, fleetAgents, len(realClusters), w.want(), maxOf(synced).Round(time.Millisecond))
	return w
}

// serverOrder lists every replica's address, first first, the others in
// index order (reversed with flip), so a dead replica's agents spread.
func serverOrder(env *ha.Env, first *ha.Replica, flip bool) []string {
	var rest []string
	for _, r := range env.Replicas {
		if r != first {
			rest = append(rest, r.RelayAddr)
		}
	}
	if flip {
		slices.Reverse(rest)
	}
	return append([]string{first.RelayAddr}, rest...)
}

// bootstrap trades token for a certificate through replica r and keeps it.
func (w *world) bootstrap(t *testing.T, r *ha.Replica, cluster, token string, roots []byte) creds {
	t.Helper()
	src, err := w.env.Net.ClientAddr()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second)
	defer cancel()
	c, err := ha.Dial(ctx, ha.ClientConfig{Addr: r.RelayAddr, ServerName: w.env.ServiceName(), Roots: roots, Source: src})
	require.NoError(t, err)
	defer c.Close()
	cert, key, err := c.BootstrapKeyPair(ctx, cluster, token)
	require.NoError(t, err, "bootstrap %s through %s", cluster, r.Name)
	return creds{cert: cert, key: key}
}

// renew asks replica r to renew c's certificate and returns the status code.
func (w *world) renew(r *ha.Replica, c creds) codes.Code {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	cl, err := ha.Dial(ctx, ha.ClientConfig{Addr: r.RelayAddr, ServerName: w.env.ServiceName(), Roots: w.roots, CertPEM: c.cert, KeyPEM: c.key})
	if err != nil {
		return codes.Unavailable
	}
	defer cl.Close()
	_, err = cl.Renew(ctx)
	return status.Code(err)
}

// want is the policy's current request timeout.
func (w *world) want() string { return fmt.Sprintf("%ds", w.timeout) }

// editPolicy changes the policy's request timeout (creating the policy the
// first time) and returns when the edit was stored.
func (w *world) editPolicy(t *testing.T) time.Time {
	t.Helper()
	if w.timeout == 0 {
		w.timeout = 4
	}
	w.timeout++
	require.NoError(t, w.mgmt.SetRequestTimeout(w.ctx, failoverPolicy, w.want()))
	return time.Now()
}

// waitLeader waits until a replica other than not holds the Lease.
func (w *world) waitLeader(t *testing.T, not *ha.Replica) *ha.Replica {
	t.Helper()
	var leader *ha.Replica
	e2e.Eventually(t, time.Minute, "a Lease holder", func() (bool, string) {
		name, err := w.env.LeaseHolder(w.ctx)
		leader = w.env.ReplicaNamed(name)
		return err == nil && leader != nil && leader != not, fmt.Sprint(name, err)
	})
	return leader
}

// watchLeader polls the Lease from now on, in the background, until a
// replica other than old holds it; the returned func waits for that (at
// most a minute) and says who and how long after since.
func (w *world) watchLeader(old *ha.Replica, since time.Time) func(t *testing.T) (*ha.Replica, time.Duration) {
	type result struct {
		r  *ha.Replica
		at time.Time
	}
	done := make(chan result, 1)
	go func() {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			name, err := w.env.LeaseHolder(w.ctx)
			if r := w.env.ReplicaNamed(name); err == nil && r != nil && r != old {
				done <- result{r, time.Now()}
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		done <- result{}
	}()
	return func(t *testing.T) (*ha.Replica, time.Duration) {
		t.Helper()
		res := <-done
		require.NotNil(t, res.r, "no replica other than %s took the Lease within a minute", old.Name)
		return res.r, res.at.Sub(since)
	}
}

// busiest is the replica holding the most agent sessions.
func (w *world) busiest() *ha.Replica {
	s := w.sessions()
	var out *ha.Replica
	for _, r := range w.env.Replicas {
		if out == nil || s[r] > s[out] {
			out = r
		}
	}
	return out
}

// sessions is each running replica's count of connected agents.
func (w *world) sessions() map[*ha.Replica]float64 {
	out := map[*ha.Replica]float64{}
	for _, r := range w.env.Replicas {
		if v, err := r.Metric(ha.MetricConnectedAgents); err == nil {
			out[r] = v
		}
	}
	return out
}

func (w *world) describeSessions() string {
	s := w.sessions()
	var parts []string
	for _, r := range w.env.Replicas {
		parts = append(parts, fmt.Sprintf("%s %v", r.Name, s[r]))
	}
	return strings.Join(parts, ", ")
}

// cluster reads a KubernetesCluster.
func (w *world) cluster(name string) (*multiclusterv1alpha1.KubernetesCluster, error) {
	u, err := w.dyn.Resource(kubernetesClusters).Namespace(w.env.Namespace).Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	kc := &multiclusterv1alpha1.KubernetesCluster{}
	return kc, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, kc)
}

// replicaOf is the replica an agent's session is on ("" if none): the
// fleet agent's own state, KubernetesCluster status for a real one.
func (w *world) replicaOf(a *tracked) string {
	if a.fleet != nil {
		st := a.fleet.State()
		if r := w.env.ReplicaAt(st.Server); st.Connected && r != nil {
			return r.Name
		}
		return ""
	}
	kc, err := w.cluster(a.cluster)
	if err != nil || !kc.Status.Connected {
		return ""
	}
	return kc.Status.Replica
}

// on are the agents whose session is on r.
func (w *world) on(r *ha.Replica) []*tracked {
	var out []*tracked
	for _, a := range w.agents {
		if w.replicaOf(a) == r.Name {
			out = append(out, a)
		}
	}
	return out
}

// syncOpts say what waitSynced waits for beside a connected agent holding
// its cluster's head version.
type syncOpts struct {
	// edit: the outputs also carry the policy's current timeout.
	edit bool
	// avoid: the session is not on this replica.
	avoid *ha.Replica
}

// syncState says whether a is connected and holds head (and what o asks).
func (w *world) syncState(a *tracked, head uint64, o syncOpts) (ok bool, detail string) {
	if a.fleet != nil {
		st := a.fleet.State()
		last, _ := w.log.last(a.fleet)
		ok := st.Connected && st.Acked == head && (!o.edit || last.timeout == w.want()) && (o.avoid == nil || st.Server != o.avoid.RelayAddr)
		return ok, fmt.Sprintf("connected %v to %s, acked %d (head %d), timeout %q (want %s), last error %v",
			st.Connected, st.Server, st.Acked, head, last.timeout, w.want(), st.LastError)
	}
	code, st, err := a.real.Status()
	if err != nil {
		return false, err.Error()
	}
	s := st.Status.Session
	ok = code == 200 && s.Connected && s.AppliedVersion == head
	got := "(not checked)"
	if ok && o.edit {
		got = w.realTimeouts(a)
		ok = got == w.want()
	}
	on := "(not checked)"
	if ok && o.avoid != nil {
		on = w.replicaOf(a)
		ok = on != "" && on != o.avoid.Name
	}
	return ok, fmt.Sprintf("readyz %d, connected %v (status: on %s), applied %d (head %d), VirtualService timeouts %s (want %s)",
		code, s.Connected, on, s.AppliedVersion, head, got, w.want())
}

// realTimeouts are the distinct request timeouts of the VirtualServices the
// agent applied in its cluster ("none" without any).
func (w *world) realTimeouts(a *tracked) string {
	l, err := a.workload.Resource(virtualServices).Namespace("").List(w.ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
	if err != nil {
		return err.Error()
	}
	seen := map[string]bool{}
	for _, vs := range l.Items {
		routes, _, _ := unstructured.NestedSlice(vs.Object, "spec", "http")
		for _, r := range routes {
			m, _ := r.(map[string]any)
			if fromSources(m) {
				continue // a route for some clients only (a policy's sourceSelector): not the failover policy's
			}
			to, _ := m["timeout"].(string)
			seen[to] = true
		}
	}
	if len(seen) == 0 {
		return "none"
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// fromSources reports whether a VirtualService route matches on its
// clients' labels.
func fromSources(route map[string]any) bool {
	matches, _ := route["match"].([]any)
	for _, m := range matches {
		if mm, ok := m.(map[string]any); ok && mm["sourceLabels"] != nil {
			return true
		}
	}
	return false
}

// waitSynced waits until every one of agents is connected and holds its
// cluster's output head with the current timeout, and returns, per agent,
// when it got there after since: the session or output set that did it
// (fleet), or when it was seen (real; polled every 100 ms); zero for an
// agent that already was and did not reconnect.
func (w *world) waitSynced(t *testing.T, since time.Time, agents []*tracked, timeout time.Duration, o syncOpts) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	pending := slices.Clone(agents)
	deadline := time.Now().Add(timeout)
	details := map[string]string{}
	for len(pending) > 0 && time.Now().Before(deadline) {
		heads, err := w.env.Heads(w.ctx)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		pending = slices.DeleteFunc(pending, func(a *tracked) bool {
			head, ok := heads[a.cluster]
			if !ok {
				details[a.name] = "no output head"
				return false
			}
			done, detail := w.syncState(a, head, o)
			details[a.name] = detail
			if !done {
				return false
			}
			var at time.Time
			if a.fleet != nil {
				if o, ok := w.log.firstOutput(a.fleet, head, since); ok {
					at = o.at
				}
				if s, ok := w.log.firstSession(a.fleet, since); ok && s.at.After(at) {
					at = s.at
				}
			} else {
				if _, st, err := a.real.Status(); err == nil && st.Status.Session.Since.After(since) {
					at = st.Status.Session.Since
				}
				if applied := realLastApplied(a.real); applied.After(since) && applied.After(at) {
					at = applied
				}
			}
			if !at.IsZero() {
				out[a.name] = at.Sub(since)
			} else {
				out[a.name] = 0
			}
			return true
		})
		if len(pending) > 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, a := range pending {
		t.Errorf("%s (%s) not synced %s after %s: %s", a.name, a.cluster, timeout, since.Format("15:04:05.000"), details[a.name])
	}
	return out
}

// realLastApplied is when the real agent last logged "output set applied".
func realLastApplied(a *ha.Agent) time.Time {
	b, err := os.ReadFile(a.Proc.LogPath())
	if err != nil {
		return time.Time{}
	}
	var last time.Time
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"msg":"output set applied"`) {
			continue
		}
		var rec struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Time.After(last) {
			last = rec.Time
		}
	}
	return last
}

// maxOf is the largest duration of m.
func maxOf(m map[string]time.Duration) time.Duration {
	var out time.Duration
	for _, d := range m {
		out = max(out, d)
	}
	return out
}

// describe lists m's durations, slowest first.
func describe(m map[string]time.Duration) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, m[k].Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// history is what a went through after t (fleet agents only).
func (w *world) history(a *tracked, t time.Time) string {
	if a.fleet == nil {
		return "(a real agent: see its log)"
	}
	return "after the kill: " + w.log.history(a.fleet, t)
}

// names are the agents' names.
func names(agents []*tracked) []string {
	var out []string
	for _, a := range agents {
		out = append(out, a.name)
	}
	return out
}
