package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// FailoverConfig is issue 22's benchmark: Replicas server replicas on one
// management apiserver, Agents agents spread over them (each given every
// replica's address, starting at a different one), each holding an output
// set from a TrafficPolicy without selectors. Then (a) the replica holding
// the most sessions (of those not holding the Lease) is SIGKILLed, and (b)
// with nothing restarted, the Lease holder is SIGKILLed and the policy is
// edited right after; each time, until every agent that was on it holds
// its cluster's current output head from another replica.
type FailoverConfig struct {
	Options
	// Agents is the fleet size; default 100. Replicas how many servers run;
	// default 3 (at least 3: two are killed).
	Agents, Replicas int
	// Snapshot each agent pushes; default one mesh, one Service, one pod.
	Snapshot SnapshotSpec
	// PerSecond paces the fleet's start; default 100 agents a second.
	PerSecond float64
	// Steady is the window in which the apiserver's writes are counted
	// with the fleet synced and nothing failing; default 60s.
	Steady time.Duration
	// Window is how long after each kill the apiserver's writes are counted
	// (at least until the phase's measurement ends); default 30s, longer
	// than a replica's Lease (15 s), so the leader's sweep of the dead
	// replica's sessions is in it.
	Window time.Duration
	// Timeout bounds each wait; default 5 minutes.
	Timeout time.Duration
}

// FailoverResult is what a failover run measured.
type FailoverResult struct {
	Agents, Replicas int
	// Load is /proc/loadavg (1, 5, 15 min) when the run started and ended.
	LoadStart, LoadEnd string
	// Synced is the fleet's start → every agent acked its cluster's head.
	Synced time.Duration
	// Sessions is how many agents each replica held once synced.
	Sessions map[string]int
	// EtcdBytes is apiserver_storage_size_bytes before the fleet
	// registered, once it synced, and at the end.
	EtcdBefore, EtcdSynced, EtcdEnd float64
	// Quiet is synced → the replicas' catch-up writes done (every
	// discovered object mirrored, every KubernetesCluster status right);
	// the steady window starts 10 s after it.
	Quiet time.Duration
	// Steady are the apiserver's writes in the steady window.
	Steady APIWrites
	// Busiest is (a), Leader (b).
	Busiest, Leader FailoverPhase
	// Regressions counts output sets older than one acked before, over the
	// whole run and fleet (must be 0).
	Regressions int
	// Replica is each replica's audit chain (killed ones included) and
	// log: records, a chain that does not verify, warnings and errors.
	Replica []ReplicaReport
	// Leaks are tokens or private keys found in any replica's logs.
	Leaks []string
}

// ReplicaReport is one replica's hygiene at the end of a run.
type ReplicaReport struct {
	Name         string
	Killed       bool
	AuditRecords uint64
	AuditError   string `json:",omitempty"`
	// Logs counts the replica's WARN and ERROR lines by message.
	Logs map[string]int
}

// FailoverPhase is one SIGKILL and what followed.
type FailoverPhase struct {
	// Killed names the replica; WasLeader: it held the Lease.
	Killed    string
	WasLeader bool
	// Sessions per replica just before the kill; Moved the agents that
	// were on the killed one; MovedTo where they went.
	Sessions map[string]int
	Moved    int
	MovedTo  map[string]int
	// Reconnected: kill → a session on another replica; Served: kill → the
	// first output set from another replica (any version); Resynced: kill
	// → the output set whose version is the cluster's current head
	// received (and acked) from another replica. Per moved agent.
	Reconnected, Served, Resynced Summary
	// AllResynced is kill → the last moved agent resynced; NotResynced
	// how many never did within the timeout, with an example.
	AllResynced time.Duration
	NotResynced int
	Example     string `json:",omitempty"`
	// OthersReconnected counts agents that were not on the killed replica
	// but opened a new session after the kill (should be 0).
	OthersReconnected int
	// Writes are the apiserver's writes from the kill over the window.
	Writes APIWrites
	// CPU used from the kill to the end of the window by each process.
	CPU CPUWindow
	// Status is KubernetesCluster status at the end of the window.
	Status ReplicaStatusCheck
	// Leader phase only. NewLeader took the Lease LeaseMoved after the
	// kill; FirstHead: kill → the first head written after it; Edit: the
	// policy edit (made right after the kill) → each agent received the
	// new timeout; EditAll: edit → every agent acked its new head.
	NewLeader      string        `json:",omitempty"`
	LeaseMoved     time.Duration `json:",omitempty"`
	FirstHead      time.Duration `json:",omitempty"`
	Edit           *Summary      `json:",omitempty"`
	EditAll        time.Duration `json:",omitempty"`
	EditNotReached int           `json:",omitempty"`
	// EditByShard is, per output-head ConfigMap, the edit → the first and
	// the last agent of its clusters that received the new timeout: how
	// the leader's head writes were spread over time.
	EditByShard map[string][2]time.Duration `json:",omitempty"`
	// Load is /proc/loadavg at the kill.
	Load string
}

// ReplicaStatusCheck compares KubernetesCluster status with the agents.
type ReplicaStatusCheck struct {
	Total int
	// Correct: connected, naming the replica the agent's session is on,
	// with the agent's acked version. WrongReplica names another replica
	// (e.g. the dead one); Disconnected says not connected; StaleAck names
	// an older version than the agent acked.
	Correct, WrongReplica, Disconnected, StaleAck int
}

// sessionLog records every session an agent opened, from its hook.
type sessionLog struct {
	mu     sync.Mutex
	opened map[string][]opened
}

type opened struct {
	server string
	at     time.Time
}

func (l *sessionLog) record(a *Agent, server string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.opened[a.Cluster()] = append(l.opened[a.Cluster()], opened{server, at})
}

// firstAfter is the first session cluster opened after t, not on server.
func (l *sessionLog) firstAfter(cluster string, t time.Time, server string) (opened, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.opened[cluster] {
		if o.at.After(t) && o.server != server {
			return o, true
		}
	}
	return opened{}, false
}

func (l *sessionLog) anyAfter(cluster string, t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.opened[cluster] {
		if o.at.After(t) {
			return true
		}
	}
	return false
}

// failoverPolicy is the request timeout the fleet's TrafficPolicy starts
// with, and failoverEdit the one phase (b) edits it to.
const failoverPolicy, failoverEdit = "5s", "7s"

// serverOrders gives each agent its list of replica addresses: 2n orders,
// every replica first in two of them, once followed by the others forward
// and once backward, so a dead replica's agents split between the two
// others. Agent i takes orders[i % 2n]; first (a non-leader) is listed
// first, so it holds at least as many agents as any other.
func serverOrders(addrs []string) [][]string {
	n := len(addrs)
	var out [][]string
	for k := range n {
		fwd, bwd := make([]string, n), make([]string, n)
		for j := range n {
			fwd[j] = addrs[(k+j)%n]
			bwd[j] = addrs[((k-j)%n+n)%n]
		}
		out = append(out, fwd)
		if n > 1 {
			out = append(out, bwd)
		}
	}
	return out
}

// Failover runs the replica-failover benchmark.
func Failover(ctx context.Context, cfg FailoverConfig) (*FailoverResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Agents == 0 {
		cfg.Agents = 100
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.Agents < 1 || cfg.Replicas < 3 {
		return nil, errors.New("failover: at least 1 agent and 3 replicas (two are killed)")
	}
	if cfg.PerSecond == 0 {
		cfg.PerSecond = 100
	}
	if cfg.Steady == 0 {
		cfg.Steady = time.Minute
	}
	if cfg.Window == 0 {
		cfg.Window = 30 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	m := cfg.Env.Mgmt
	r := &FailoverResult{Agents: cfg.Agents, Replicas: cfg.Replicas, LoadStart: LoadAverage()}
	var err error
	if r.EtcdBefore, err = m.EtcdBytes(ctx); err != nil {
		return nil, err
	}
	reps, err := cfg.startReplicas(ctx, "failover", cfg.Replicas)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, rep := range reps {
			_ = rep.Stop()
		}
	}()
	byAddr := map[string]*Replica{}
	for _, rep := range reps {
		byAddr[rep.Addr] = rep
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	leader, err := waitLeader(wctx, m, reps, "")
	if err != nil {
		return nil, err
	}
	cfg.Logf("failover: %d replicas up; %s holds the Lease", len(reps), leader)
	if err := m.SetRequestTimeout(ctx, policyName, failoverPolicy); err != nil {
		return nil, err
	}
	members, _, _, err := cfg.registerFleet(ctx, "fo", cfg.Agents)
	if err != nil {
		return nil, err
	}
	roots, err := m.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}

	// The fleet: non-leaders first in the address lists.
	var addrs []string
	for _, rep := range reps {
		if rep.Name != leader {
			addrs = append(addrs, rep.Addr)
		}
	}
	for _, rep := range reps {
		if rep.Name == leader {
			addrs = append(addrs, rep.Addr)
		}
	}
	orders := serverOrders(addrs)
	sl := &sessionLog{opened: map[string][]opened{}}
	arr := &arrivals{}
	f := &Fleet{byCluster: map[string]*Agent{}}
	for i, mem := range members {
		a, err := NewAgent(AgentConfig{Cluster: mem.Cluster, Token: mem.Token, Source: SourceAddr(i),
			Servers: orders[i%len(orders)], Roots: roots, Snapshot: cfg.Snapshot.Snapshot(mem.Cluster),
			Hooks: Hooks{SessionOpened: sl.record, Output: arr.observe}})
		if err != nil {
			return nil, fmt.Errorf("agent %d: %w", i, err)
		}
		f.agents = append(f.agents, a)
		f.byCluster[mem.Cluster] = a
	}
	defer f.Stop()
	start := f.StartPaced(ctx, cfg.PerSecond)
	cfg.Logf("failover: %d agents started at %.0f/s; waiting until each acked its cluster's head", cfg.Agents, cfg.PerSecond)
	if _, err := pollUntil(wctx, 250*time.Millisecond, func() (bool, error) {
		hs, err := m.OutputHeads(ctx)
		if err != nil {
			return false, err
		}
		for _, a := range f.agents {
			st := a.State()
			if !st.Connected || st.Acked == 0 || st.Acked != hs[st.Cluster] {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("fleet did not sync: %w", fleetExample(f))
	}
	r.Synced = time.Since(start)
	r.Sessions = sessionsOf(f, byAddr)
	cfg.Logf("failover: every agent holds its head %s after the start; sessions %v", r.Synced.Round(time.Millisecond), r.Sessions)

	// A steady window: what the replicas write with nothing happening,
	// after their catch-up writes.
	clusters := map[string]bool{}
	for _, mem := range members {
		clusters[mem.Cluster] = true
	}
	want := cfg.Agents * len(DiscoveredObjectsOf(cfg.Snapshot.Snapshot("x")))
	synced := time.Now()
	if _, err := pollUntil(wctx, time.Second, func() (bool, error) {
		n, err := m.DiscoveredObjects(ctx, clusters)
		if err != nil || n < want {
			return false, err
		}
		c, err := checkReplicaStatus(ctx, m, f, byAddr)
		return c.Correct == c.Total, err
	}); err != nil {
		return nil, fmt.Errorf("the replicas did not catch up: %w", err)
	}
	r.Quiet = time.Since(synced)
	cfg.Logf("failover: objects mirrored and statuses right %s after the fleet synced", r.Quiet.Round(time.Millisecond))
	time.Sleep(10 * time.Second)
	if r.EtcdSynced, err = m.EtcdBytes(ctx); err != nil {
		return nil, err
	}
	before, err := m.APIRequests(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	time.Sleep(cfg.Steady)
	after, err := m.APIRequests(ctx)
	if err != nil {
		return nil, err
	}
	r.Steady = writesOf(subAPI(after, before), time.Since(t0))
	cfg.Logf("failover: steady: %.0f writes in %s (%.1f/s)", r.Steady.Total, r.Steady.Window.Round(time.Second), r.Steady.PerSecond)

	// (a) The busiest replica that does not hold the Lease.
	holder, err := m.LeaseHolder(ctx)
	if err != nil {
		return nil, err
	}
	var victim *Replica
	for _, rep := range reps {
		if rep.Name != holder && (victim == nil || r.Sessions[rep.Name] > r.Sessions[victim.Name]) {
			victim = rep
		}
	}
	alive := slices.DeleteFunc(slices.Clone(reps), func(x *Replica) bool { return x == victim })
	if r.Busiest, err = cfg.failoverPhase(ctx, f, sl, arr, byAddr, victim, holder, alive, false); err != nil {
		return nil, err
	}

	// (b) The Lease holder, nothing restarted.
	if holder, err = m.LeaseHolder(ctx); err != nil {
		return nil, err
	}
	victim = nil
	for _, rep := range alive {
		if rep.Name == holder {
			victim = rep
		}
	}
	if victim == nil {
		return nil, fmt.Errorf("the Lease names %q, not a live replica", holder)
	}
	alive = slices.DeleteFunc(slices.Clone(alive), func(x *Replica) bool { return x == victim })
	if r.Leader, err = cfg.failoverPhase(ctx, f, sl, arr, byAddr, victim, holder, alive, true); err != nil {
		return nil, err
	}

	for _, st := range f.States() {
		r.Regressions += st.Regressions
	}
	if r.EtcdEnd, err = m.EtcdBytes(ctx); err != nil {
		return nil, err
	}
	f.Stop()
	for _, rep := range reps {
		rr := ReplicaReport{Name: rep.Name, Killed: rep.Name == r.Busiest.Killed || rep.Name == r.Leader.Killed}
		if n, err := rep.VerifyAudit(); err != nil {
			rr.AuditError = err.Error()
		} else {
			rr.AuditRecords = n
		}
		lines, err := ReadLog(rep.LogPath(), time.Time{}, func(l LogLine) bool { return l.Level == "WARN" || l.Level == "ERROR" })
		if err != nil {
			return nil, err
		}
		rr.Logs = LogCounts(lines)
		r.Replica = append(r.Replica, rr)
		leaks, err := rep.FindSecrets(members)
		if err != nil {
			return nil, err
		}
		r.Leaks = append(r.Leaks, leaks...)
	}
	if err := m.DeleteTrafficPolicy(ctx, policyName); err != nil {
		return nil, err
	}
	r.LoadEnd = LoadAverage()
	return r, nil
}

// failoverPhase kills victim and measures until every agent that was on it
// holds its cluster's current head from another replica (and, with edit,
// until the policy edit made right after the kill reached every agent and
// another replica holds the Lease), then counts the apiserver's writes up
// to Window after the kill and checks KubernetesCluster status.
func (cfg *FailoverConfig) failoverPhase(ctx context.Context, f *Fleet, sl *sessionLog, arr *arrivals, byAddr map[string]*Replica,
	victim *Replica, holder string, alive []*Replica, edit bool) (FailoverPhase, error) {
	m := cfg.Env.Mgmt
	p := FailoverPhase{Killed: victim.Name, WasLeader: victim.Name == holder, Sessions: sessionsOf(f, byAddr), MovedTo: map[string]int{}}
	var moved []*Agent
	for _, a := range f.agents {
		if a.State().Server == victim.Addr {
			moved = append(moved, a)
		}
	}
	p.Moved = len(moved)
	headsBefore, err := m.OutputHeads(ctx)
	if err != nil {
		return p, err
	}
	apiBefore, err := m.APIRequests(ctx)
	if err != nil {
		return p, err
	}
	pids := cfg.Env.Pids()
	for _, rep := range alive {
		pids[rep.Name] = rep.Pid()
	}
	pids["harness"] = 0
	meter, err := StartCPU(pids)
	if err != nil {
		return p, err
	}
	if edit {
		arr.expect(failoverEdit)
	}
	p.Load = LoadAverage()
	cfg.Logf("failover: SIGKILL %s (Lease holder: %v), %d agents on it; sessions %v", victim.Name, p.WasLeader, p.Moved, p.Sessions)
	kill := time.Now()
	if err := victim.Kill(); err != nil {
		return p, fmt.Errorf("kill %s: %w", victim.Name, err)
	}
	var editAt time.Time
	if edit {
		editAt = time.Now()
		if err := m.SetRequestTimeout(ctx, policyName, failoverEdit); err != nil {
			return p, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	resynced := map[string]time.Time{}
	var leaseAt, headAt, editDone time.Time
	_, waitErr := pollUntil(wctx, 200*time.Millisecond, func() (bool, error) {
		now := time.Now()
		hs, err := m.OutputHeads(ctx)
		if err != nil {
			return false, err
		}
		if headAt.IsZero() {
			for c, v := range hs {
				if v != headsBefore[c] {
					headAt = now
					break
				}
			}
		}
		for _, a := range moved {
			st := a.State()
			if _, ok := resynced[st.Cluster]; ok {
				continue
			}
			if !st.Connected || st.Server == victim.Addr || st.Acked == 0 || st.Acked != hs[st.Cluster] {
				continue
			}
			for _, o := range st.Outputs {
				if o.At.After(kill) && o.Server != victim.Addr && o.Version == st.Acked {
					resynced[st.Cluster] = o.At
					break
				}
			}
		}
		done := len(resynced) == len(moved)
		if !edit {
			return done, nil
		}
		if leaseAt.IsZero() {
			h, err := m.LeaseHolder(ctx)
			if err != nil {
				return false, err
			}
			if h != "" && h != victim.Name {
				leaseAt, p.NewLeader = now, h
			}
		}
		if editDone.IsZero() && arr.count() == len(f.agents) {
			all := true
			for _, a := range f.agents {
				if st := a.State(); st.Acked != hs[st.Cluster] || hs[st.Cluster] == headsBefore[st.Cluster] {
					all = false
					break
				}
			}
			if all {
				editDone = now
			}
		}
		return done && !leaseAt.IsZero() && !editDone.IsZero(), nil
	})
	measured := time.Now()
	if waitErr != nil {
		cfg.Logf("failover: %s: %v", victim.Name, waitErr)
	}
	var reconnected, served, resync []time.Duration
	for _, a := range moved {
		st := a.State()
		if o, ok := sl.firstAfter(st.Cluster, kill, victim.Addr); ok {
			reconnected = append(reconnected, o.at.Sub(kill))
		}
		for _, o := range st.Outputs {
			if o.At.After(kill) && o.Server != victim.Addr {
				served = append(served, o.At.Sub(kill))
				break
			}
		}
		if at, ok := resynced[st.Cluster]; ok {
			resync = append(resync, at.Sub(kill))
			p.AllResynced = max(p.AllResynced, at.Sub(kill))
			if rep := byAddr[st.Server]; rep != nil {
				p.MovedTo[rep.Name]++
			}
			continue
		}
		p.NotResynced++
		if p.Example == "" {
			p.Example = fmt.Sprintf("%s: connected %v to %s, acked %d, %d outputs kept, last error %v", st.Cluster, st.Connected, st.Server, st.Acked, len(st.Outputs), st.LastError)
		}
	}
	p.Reconnected, p.Served, p.Resynced = Summarize(reconnected), Summarize(served), Summarize(resync)
	wasOn := map[*Agent]bool{}
	for _, a := range moved {
		wasOn[a] = true
	}
	for _, a := range f.agents {
		if !wasOn[a] && sl.anyAfter(a.Cluster(), kill) {
			p.OthersReconnected++
		}
	}
	if edit {
		if !leaseAt.IsZero() {
			p.LeaseMoved = leaseAt.Sub(kill)
		}
		if !headAt.IsZero() {
			p.FirstHead = headAt.Sub(kill)
		}
		arr.mu.Lock()
		var reach []time.Duration
		p.EditByShard = map[string][2]time.Duration{}
		for c, at := range arr.at {
			d := at.Sub(editAt)
			reach = append(reach, d)
			spanByShard(p.EditByShard, c, d)
		}
		arr.mu.Unlock()
		s := Summarize(reach)
		p.Edit = &s
		p.EditNotReached = len(f.agents) - len(reach)
		if !editDone.IsZero() {
			p.EditAll = editDone.Sub(editAt)
		}
	}
	cfg.Logf("failover: %s: %d moved; reconnected %s; resynced %s; all after %s; %d never", victim.Name, p.Moved, p.Reconnected, p.Resynced, p.AllResynced.Round(time.Millisecond), p.NotResynced)
	if edit {
		cfg.Logf("failover: %s took the Lease %s after the kill; first new head %s; edit → every agent acked %s (%s)", p.NewLeader, p.LeaseMoved.Round(time.Millisecond), p.FirstHead.Round(time.Millisecond), p.EditAll.Round(time.Millisecond), p.Edit)
	}

	// The window: the apiserver's writes and the processes' CPU, then status.
	end := kill.Add(cfg.Window)
	if measured.After(end) {
		end = measured
	}
	time.Sleep(time.Until(end))
	apiAfter, err := m.APIRequests(ctx)
	if err != nil {
		return p, err
	}
	p.Writes = writesOf(subAPI(apiAfter, apiBefore), time.Since(kill))
	if p.CPU, err = meter.Stop(); err != nil {
		return p, err
	}
	if p.Status, err = checkReplicaStatus(ctx, m, f, byAddr); err != nil {
		return p, err
	}
	cfg.Logf("failover: %s: %.0f apiserver writes in %s (%.1f/s); status %+v", victim.Name, p.Writes.Total, p.Writes.Window.Round(time.Second), p.Writes.PerSecond, p.Status)
	return p, nil
}

// waitLeader waits until the Lease names one of reps other than not.
func waitLeader(ctx context.Context, m *Management, reps []*Replica, not string) (string, error) {
	var holder string
	_, err := pollUntil(ctx, 200*time.Millisecond, func() (bool, error) {
		h, err := m.LeaseHolder(ctx)
		if err != nil {
			return false, err
		}
		for _, rep := range reps {
			if rep.Name == h && h != not {
				holder = h
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("no replica holds the Lease %s: %w", ServerLease, err)
	}
	return holder, nil
}

// sessionsOf counts the agents with an open session by replica.
func sessionsOf(f *Fleet, byAddr map[string]*Replica) map[string]int {
	out := map[string]int{}
	for _, a := range f.agents {
		if st := a.State(); st.Connected {
			if rep := byAddr[st.Server]; rep != nil {
				out[rep.Name]++
			}
		}
	}
	return out
}

// fleetExample describes agents that have not synced, for an error.
func fleetExample(f *Fleet) error {
	missing := 0
	var ex AgentState
	for _, a := range f.agents {
		if st := a.State(); !st.Connected || st.Acked == 0 {
			if missing == 0 {
				ex = st
			}
			missing++
		}
	}
	return fmt.Errorf("%d of %d agents without a session or an acked set (e.g. %s: last error %v)", missing, len(f.agents), ex.Cluster, ex.LastError)
}

// checkReplicaStatus compares each agent with its KubernetesCluster status.
func checkReplicaStatus(ctx context.Context, m *Management, f *Fleet, byAddr map[string]*Replica) (ReplicaStatusCheck, error) {
	sts, err := m.ReplicaStatuses(ctx)
	if err != nil {
		return ReplicaStatusCheck{}, err
	}
	var c ReplicaStatusCheck
	for _, a := range f.agents {
		st := a.State()
		ks, ok := sts[st.Cluster]
		if !ok {
			return c, fmt.Errorf("KubernetesCluster %s is missing", st.Cluster)
		}
		c.Total++
		name := ""
		if rep := byAddr[st.Server]; rep != nil && st.Connected {
			name = rep.Name
		}
		switch {
		case !ks.Connected:
			c.Disconnected++
		case ks.Replica != name:
			c.WrongReplica++
		case ks.Applied < st.Acked:
			c.StaleAck++
		default:
			c.Correct++
		}
	}
	return c, nil
}
