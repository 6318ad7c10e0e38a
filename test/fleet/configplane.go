package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/heads"
)

// ConfigPlaneConfig is issue 21's fleet: Clusters agents, each pushing one
// Istio mesh with one injected Deployment and its Service and acknowledging
// every output set; one TrafficPolicy without selectors whose request
// timeout is edited Edits times; then every cluster is deregistered.
type ConfigPlaneConfig struct {
	Options
	// Clusters is the fleet size; default 100.
	Clusters int
	// Edits of the policy's timeout (5s → 7s → 5s …); default 5.
	Edits int
	// Snapshot each agent pushes; default one Service of one pod.
	Snapshot SnapshotSpec
	// Timeout bounds each wait; default 5 minutes.
	Timeout time.Duration
	// Replicas is how many servers run (replica-0 …, agents spread over
	// them as in the failover scenario); default 1, a single server.
	Replicas int
	// Settle is how long the fleet idles after the policy first reached
	// every agent, before the first edit. Zero (the default) edits at once,
	// while a just-connected fleet's once-per-cluster status writes (trust
	// domain grants, the first status heartbeat) still land; longer than
	// the status heartbeat (45 s at most) measures edits of a settled
	// fleet.
	Settle time.Duration
}

// EditResult is one policy edit reaching the fleet.
type EditResult struct {
	// From and To are the timeouts.
	From, To string
	// Reach is edit → the agent received a set with the new timeout, per
	// agent.
	Reach Summary
	// Objects is the number of objects in each agent's set (min and max),
	// PolicyObjects the ones the policy produced, Kinds those by kind in
	// the first agent's set, RemoteHosts how many of them name a
	// `<svc>.<ns>.svc.<cluster>.global` host of another cluster.
	ObjectsMin, ObjectsMax, PolicyObjectsMin, PolicyObjectsMax int
	Kinds                                                      map[string]int
	RemoteHosts                                                int
	// Translations are the server's "translated" log lines that published
	// to clusters (took, recomputed units, clusters_published), between
	// the edit and 5 s later (the controller gathers a change for 20 ms,
	// then translates and publishes).
	Translations []Translation
	// CPU is the CPU time each process used from the edit until every
	// agent had it: this harness (its agents), the servers, the
	// management apiserver and etcd. On one machine they share its cores,
	// so this says whose work an edit's reach waits for.
	CPU map[string]time.Duration
	// CPUBefore is the CPU time each used in the second before the edit,
	// once the previous edit's acks had reached the agents: the fleet's
	// background (status heartbeats, ack records, keepalives).
	CPUBefore map[string]time.Duration
	// HeadShards is, per output-head shard (heads.ShardName), the first
	// and last agent of the shard to receive the edit, after it: with
	// leader election on (this harness's servers, one replica too) a set
	// is served once the Lease holder's write of its shard's heads
	// returned, so the shards' first arrivals show when those writes did.
	HeadShards map[string][2]time.Duration
	// Replicas is, per server replica (its name), the first and last of
	// its agents to receive the edit, after it: whether the spread is one
	// replica's serving or the heads' writes and watches.
	Replicas map[string][2]time.Duration `json:",omitempty"`
	at       time.Time
}

// Translation is one "translated" line of the server's log.
type Translation struct {
	// After is the line's time after the edit (when the translation had
	// published); Took how long it ran.
	After             time.Duration
	Took              time.Duration
	Recomputed        int
	ClustersPublished int
}

// ConfigPlaneResult is what the config-plane run measured.
type ConfigPlaneResult struct {
	Clusters int
	// Replicas is how many servers ran; Leader the one holding the Lease
	// at the first edit, whose log the Translations are read from.
	Replicas int
	Leader   string
	// Settle is how long the fleet idled before the first edit.
	Settle time.Duration
	Hygiene
	// Pushed is agent start → its snapshot accepted.
	Pushed Summary
	// MirroredAfterFirst/Last: the first/last snapshot accepted → every
	// cluster's Mesh, Workload and Destination in the management cluster.
	MirroredAfterFirst, MirroredAfterLast time.Duration
	// Edits, in order; Reach summarises every agent of every edit.
	Edits []EditResult
	Reach Summary
	// Removed: deregistration of every cluster → none of their discovered
	// objects left. Refused agents were told their certificate is refused.
	Removed time.Duration
	// RemovedAfterLast is from the end of the harness's deregistration
	// (every KubernetesCluster and its tokens deleted, 32 at once) to none
	// left: the server's own part of Removed.
	RemovedAfterLast time.Duration
	Refused          int
	// ConnectRequests and RemoveRequests are the management API server's
	// requests (verb and resource) from the agents' start until every
	// discovered object is there, and from deregistration until none is
	// left: the server's, and the harness's own polls (LIST) and
	// deregistration (DELETE). EditRequests are those of the edits, from
	// the first edit's settling to the last edit reaching every agent (the
	// harness's own: the edits, PATCH trafficpolicies).
	ConnectRequests, RemoveRequests, EditRequests map[string]float64
	// Logs counts the server's log lines of the whole run; Throttled the
	// client-side throttling client-go reported in them.
	Logs      map[string]int
	Throttled Throttled
}

// policyName is the TrafficPolicy ConfigPlane edits.
const policyName = "fleet-timeout"

// arrivals records when each agent first got an output set holding a
// given request timeout from the policy.
type arrivals struct {
	mu      sync.Mutex
	want    string
	at      map[string]time.Time
	objects map[string][2]int // all objects, the policy's objects
	kinds   map[string]map[string]int
	remote  map[string]int
	server  map[string]string // the address the agent had the set from
}

func (r *arrivals) expect(timeout string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.want = `"timeout":"` + timeout + `"`
	r.at, r.objects, r.kinds, r.remote, r.server = map[string]time.Time{}, map[string][2]int{}, map[string]map[string]int{}, map[string]int{}, map[string]string{}
}

func (r *arrivals) observe(a *Agent, o Output) {
	r.mu.Lock()
	want := r.want
	_, seen := r.at[a.Cluster()]
	r.mu.Unlock()
	if want == "" || seen {
		return
	}
	parent := "TrafficPolicy/"
	policy, timed := 0, false
	kinds := map[string]int{}
	remote := 0
	for _, obj := range o.Set.GetObjects() {
		mine := false
		for _, p := range obj.GetParents() {
			if strings.HasPrefix(p, parent) && strings.HasSuffix(p, "/"+policyName) {
				mine = true
			}
		}
		if !mine {
			continue
		}
		policy++
		m := string(obj.GetManifest())
		timed = timed || strings.Contains(m, want)
		var h manifestHead
		if json.Unmarshal(obj.GetManifest(), &h) == nil {
			kinds[h.Kind]++
		}
		if strings.Contains(m, ".global") && !strings.Contains(m, ".svc."+a.Cluster()+".global") {
			remote++
		}
	}
	if !timed {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.at[a.Cluster()]; !seen && r.want == want {
		r.at[a.Cluster()] = o.At
		r.objects[a.Cluster()] = [2]int{o.Objects, policy}
		r.kinds[a.Cluster()] = kinds
		r.remote[a.Cluster()] = remote
		r.server[a.Cluster()] = a.serverAddr()
	}
}

func (r *arrivals) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// widen widens the span (first and last arrival) of key in spans to d;
// a nil spans is made.
func widen(spans map[string][2]time.Duration, key string, d time.Duration) map[string][2]time.Duration {
	if spans == nil {
		spans = map[string][2]time.Duration{}
	}
	cur, ok := spans[key]
	if !ok {
		cur = [2]time.Duration{d, d}
	}
	spans[key] = [2]time.Duration{min(cur[0], d), max(cur[1], d)}
	return spans
}

// ConfigPlane runs the config-plane measurements.
func ConfigPlane(ctx context.Context, cfg ConfigPlaneConfig) (*ConfigPlaneResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Settle < 0 {
		return nil, fmt.Errorf("settle %s: must not be negative", cfg.Settle)
	}
	if cfg.Clusters == 0 {
		cfg.Clusters = 100
	}
	if cfg.Edits == 0 {
		cfg.Edits = 5
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	servers, err := cfg.startConfigServers(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, s := range servers {
			_ = s.Stop()
		}
	}()
	srv := servers[0].Server // During's server; the Lease holder once known
	addrs := make([]string, len(servers))
	byAddr := map[string]string{}
	for i, s := range servers {
		addrs[i], byAddr[s.Addr] = s.Addr, s.Name
	}
	runStart := time.Now()
	members, _, _, err := cfg.registerFleet(ctx, "cfg", cfg.Clusters)
	if err != nil {
		return nil, err
	}
	roots, err := cfg.Env.Mgmt.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	arr := &arrivals{}
	f, err := NewFleet(FleetConfig{Servers: addrs, Roots: roots, Members: members,
		Snapshot: func(c string) *relaypb.Snapshot { return cfg.Snapshot.Snapshot(c) },
		Agent:    AgentConfig{Hooks: Hooks{Output: arr.observe}}})
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	clusters := map[string]bool{}
	for _, m := range members {
		clusters[m.Cluster] = true
	}
	wantObjects := cfg.Clusters * len(DiscoveredObjectsOf(cfg.Snapshot.Snapshot("x")))
	r := &ConfigPlaneResult{Clusters: cfg.Clusters, Replicas: cfg.Replicas, Leader: servers[0].Name, Settle: cfg.Settle}

	// 1. Clusters connect: their snapshots become discovered objects.
	apiBefore, err := cfg.Env.Mgmt.APIRequests(ctx)
	if err != nil {
		return nil, err
	}
	stop := cfg.during(ctx, srv)
	f.Start(ctx)
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeout+cfg.Settle) // the settling is not a wait
	defer cancel()
	if err := f.Wait(wctx, "pushed", func(st AgentState) bool { return !st.Timeline.Pushed.IsZero() }); err != nil {
		stop()
		return nil, err
	}
	var first, last time.Time
	var pushed []time.Duration
	for _, st := range f.States() {
		p := st.Timeline.Pushed
		pushed = append(pushed, p.Sub(st.Timeline.Started))
		if first.IsZero() || p.Before(first) {
			first = p
		}
		if p.After(last) {
			last = p
		}
	}
	r.Pushed = Summarize(pushed)
	mirrored, err := pollUntil(wctx, 100*time.Millisecond, func() (bool, error) {
		n, err := cfg.Env.Mgmt.DiscoveredObjects(ctx, clusters)
		return n == wantObjects, err
	})
	stop()
	if err != nil {
		return nil, fmt.Errorf("waiting for %d discovered objects: %w", wantObjects, err)
	}
	r.MirroredAfterFirst, r.MirroredAfterLast = mirrored.Sub(first), mirrored.Sub(last)
	if r.ConnectRequests, err = apiSince(ctx, cfg.Env.Mgmt, apiBefore); err != nil {
		return nil, err
	}
	cfg.Logf("config: %d clusters' objects mirrored %s after the first snapshot was accepted (%s after the last)", cfg.Clusters, r.MirroredAfterFirst.Round(time.Millisecond), r.MirroredAfterLast.Round(time.Millisecond))

	// 2. The policy, then edits of its timeout.
	timeouts := []string{"5s", "7s"}
	arr.expect(timeouts[0])
	if err := cfg.Env.Mgmt.SetRequestTimeout(ctx, policyName, timeouts[0]); err != nil {
		return nil, err
	}
	if _, err := pollUntil(wctx, 50*time.Millisecond, func() (bool, error) { return arr.count() == cfg.Clusters, nil }); err != nil {
		return nil, fmt.Errorf("policy reached %d of %d agents: %w", arr.count(), cfg.Clusters, err)
	}
	if len(servers) > 1 {
		holder, err := cfg.Env.Mgmt.LeaseHolder(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range servers {
			if s.Name == holder {
				srv, r.Leader = s.Server, s.Name
			}
		}
	}
	if cfg.Settle > 0 {
		cfg.Logf("config: the fleet settles for %s before the first edit", cfg.Settle)
		select {
		case <-wctx.Done():
			return nil, wctx.Err()
		case <-time.After(cfg.Settle):
		}
	}
	var all []time.Duration
	// Whose CPU each edit waits for: the servers', the apiserver's and
	// etcd's, and this process's (the agents').
	pids := cfg.Env.Pids()
	pids["harness"] = 0
	for _, s := range servers {
		if len(servers) == 1 {
			pids["server"] = s.Server.Pid()
		} else {
			pids["server "+s.Name] = s.Server.Pid()
		}
	}
	editsFrom, err := cfg.Env.Mgmt.APIRequests(ctx)
	if err != nil {
		return nil, err
	}
	for e := range cfg.Edits {
		from, to := timeouts[e%2], timeouts[(e+1)%2]
		// Let the acks of the previous version settle.
		if err := f.Wait(wctx, "acked", func(st AgentState) bool {
			return len(st.Outputs) > 0 && st.Acked == st.Outputs[len(st.Outputs)-1].Version
		}); err != nil {
			return nil, err
		}
		idle, err := StartCPU(pids)
		if err != nil {
			return nil, err
		}
		time.Sleep(time.Second)
		before, err := idle.Stop()
		if err != nil {
			return nil, err
		}
		arr.expect(to)
		stop := cfg.during(ctx, srv)
		meter, err := StartCPU(pids)
		if err != nil {
			stop()
			return nil, err
		}
		edit := time.Now()
		if err := cfg.Env.Mgmt.SetRequestTimeout(ctx, policyName, to); err != nil {
			stop()
			return nil, err
		}
		_, err = pollUntil(wctx, 10*time.Millisecond, func() (bool, error) { return arr.count() == cfg.Clusters, nil })
		cpu, cpuErr := meter.Stop()
		stop()
		if err != nil {
			return nil, fmt.Errorf("edit %d reached %d of %d agents: %w", e, arr.count(), cfg.Clusters, err)
		}
		if cpuErr != nil {
			return nil, cpuErr
		}
		er := EditResult{From: from, To: to, CPU: cpu.CPU, CPUBefore: before.CPU, HeadShards: map[string][2]time.Duration{}}
		var reach []time.Duration
		arr.mu.Lock()
		for c, at := range arr.at {
			d := at.Sub(edit)
			reach = append(reach, d)
			spanByShard(er.HeadShards, c, d)
			if len(servers) > 1 {
				name, ok := byAddr[arr.server[c]]
				if !ok {
					name = "unknown"
				}
				er.Replicas = widen(er.Replicas, name, d)
			}
			o := arr.objects[c]
			if er.ObjectsMax == 0 || o[0] < er.ObjectsMin {
				er.ObjectsMin = o[0]
			}
			if er.PolicyObjectsMax == 0 || o[1] < er.PolicyObjectsMin {
				er.PolicyObjectsMin = o[1]
			}
			er.ObjectsMax, er.PolicyObjectsMax = max(er.ObjectsMax, o[0]), max(er.PolicyObjectsMax, o[1])
		}
		er.Kinds = arr.kinds[members[0].Cluster]
		er.RemoteHosts = arr.remote[members[0].Cluster]
		arr.mu.Unlock()
		er.Reach = Summarize(reach)
		all = append(all, reach...)
		er.at = edit
		cfg.Logf("config: edit %s → %s reached %d agents: %s; %d objects per set, %d from the policy", from, to, cfg.Clusters, er.Reach, er.ObjectsMax, er.PolicyObjectsMax)
		cfg.Logf("config: CPU while it did: %s (in the second before: %s); first and last agent per head shard: %s", cpuLine(er.CPU), cpuLine(er.CPUBefore), shardLine(er.HeadShards))
		if len(er.Replicas) > 0 {
			cfg.Logf("config: first and last agent per replica: %s", spanLine(er.Replicas, func(name string) string { return name }))
		}
		r.Edits = append(r.Edits, er)
	}
	r.Reach = Summarize(all)
	if r.EditRequests, err = apiSince(ctx, cfg.Env.Mgmt, editsFrom); err != nil {
		return nil, err
	}
	cfg.Logf("config: API requests during the edits: %s", topRequests(r.EditRequests, 8))
	if err := addTranslations(srv, r.Edits); err != nil {
		return nil, err
	}

	// 3. Deregistration removes every cluster's discovered objects.
	if apiBefore, err = cfg.Env.Mgmt.APIRequests(ctx); err != nil {
		return nil, err
	}
	stop = cfg.during(ctx, srv)
	dereg := time.Now()
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.Cluster
	}
	if err := cfg.Env.Mgmt.Deregister(ctx, names, cfg.Parallel); err != nil {
		stop()
		return nil, err
	}
	deregistered := time.Now()
	gone, err := pollUntil(wctx, 100*time.Millisecond, func() (bool, error) {
		n, err := cfg.Env.Mgmt.DiscoveredObjects(ctx, clusters)
		return n == 0, err
	})
	stop()
	if err != nil {
		return nil, fmt.Errorf("waiting for the discovered objects to go: %w", err)
	}
	r.Removed, r.RemovedAfterLast = gone.Sub(dereg), max(0, gone.Sub(deregistered))
	if r.RemoveRequests, err = apiSince(ctx, cfg.Env.Mgmt, apiBefore); err != nil {
		return nil, err
	}
	cfg.Logf("config: %d clusters' objects removed %s after deregistration began (%s after it ended)", cfg.Clusters, r.Removed.Round(time.Millisecond), r.RemovedAfterLast.Round(time.Millisecond))
	cfg.Logf("config: API requests while connecting: %s; while removing: %s", topRequests(r.ConnectRequests, 8), topRequests(r.RemoveRequests, 8))
	for _, st := range f.States() {
		if st.Refused != nil {
			r.Refused++
		}
	}
	if err := cfg.Env.Mgmt.DeleteTrafficPolicy(ctx, policyName); err != nil {
		return nil, err
	}
	var lines []LogLine
	for _, s := range servers {
		l, err := linesBetween(s.Server, runStart, time.Now())
		if err != nil {
			return nil, err
		}
		lines = append(lines, l...)
	}
	r.Logs, r.Throttled = LogCounts(lines), ThrottledOf(lines)
	f.Stop()
	for _, s := range servers {
		h, err := s.CheckHygiene(members)
		if err != nil {
			return nil, err
		}
		r.AuditRecords += h.AuditRecords
		r.Leaks = append(r.Leaks, h.Leaks...)
	}
	return r, nil
}

// startConfigServers starts the scenario's one server, or its replicas.
func (cfg *ConfigPlaneConfig) startConfigServers(ctx context.Context) ([]*Replica, error) {
	if cfg.Replicas == 1 {
		srv, err := cfg.startServer(ctx, "config-server")
		if err != nil {
			return nil, err
		}
		return []*Replica{{Name: "config-server", Server: srv}}, nil
	}
	return cfg.startReplicas(ctx, "config", cfg.Replicas)
}

// apiSince is the management API server's requests since the reading
// before.
func apiSince(ctx context.Context, m *Management, before map[string]float64) (map[string]float64, error) {
	after, err := m.APIRequests(ctx)
	if err != nil {
		return nil, err
	}
	return subAPI(after, before), nil
}

// topRequests prints the n most frequent entries of a request count and
// the total, "total 5,012: 3,000 POST destinations, …".
func topRequests(reqs map[string]float64, n int) string {
	keys := make([]string, 0, len(reqs))
	total := 0.0
	for k, v := range reqs {
		keys = append(keys, k)
		total += v
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(reqs[b], reqs[a]), strings.Compare(a, b)) })
	var b strings.Builder
	fmt.Fprintf(&b, "total %.0f", total)
	for i, k := range keys {
		if i == n {
			break
		}
		fmt.Fprintf(&b, "; %.0f %s", reqs[k], k)
	}
	return b.String()
}

// pollUntil calls cond every interval until it holds (returning when) or
// ctx ends.
func pollUntil(ctx context.Context, interval time.Duration, cond func() (bool, error)) (time.Time, error) {
	for {
		ok, err := cond()
		if err != nil && !errors.Is(err, context.Canceled) {
			return time.Time{}, err
		}
		if ok {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// addTranslations gives each edit the "translated" lines that published to
// clusters within 5 s after it (and before the next edit).
func addTranslations(srv *Server, edits []EditResult) error {
	if len(edits) == 0 {
		return nil
	}
	lines, err := ReadLog(srv.LogPath(), edits[0].at, func(l LogLine) bool { return l.Msg == "translated" })
	if err != nil {
		return err
	}
	num := func(l LogLine, k string) int { f, _ := l.Attrs[k].(float64); return int(f) }
	// The server logs durations as strings ("138.3ms").
	dur := func(l LogLine, k string) time.Duration {
		s, _ := l.Attrs[k].(string)
		d, _ := time.ParseDuration(s)
		return d
	}
	for _, l := range lines {
		if num(l, "clusters_published") == 0 {
			continue
		}
		for i := len(edits) - 1; i >= 0; i-- {
			if !l.Time.Before(edits[i].at) {
				if l.Time.Sub(edits[i].at) < 5*time.Second {
					edits[i].Translations = append(edits[i].Translations, Translation{After: l.Time.Sub(edits[i].at), Took: dur(l, "took"),
						Recomputed: num(l, "recomputed"), ClustersPublished: num(l, "clusters_published")})
				}
				break
			}
		}
	}
	return nil
}

// spanByShard widens the span (first and last arrival) of cluster's
// output-head shard in spans (not nil) to d.
func spanByShard(spans map[string][2]time.Duration, cluster string, d time.Duration) {
	_ = widen(spans, heads.ShardName(cluster), d)
}

func cpuLine(cpu map[string]time.Duration) string {
	var parts []string
	for _, role := range slices.Sorted(maps.Keys(cpu)) {
		parts = append(parts, fmt.Sprintf("%s %dms", role, cpu[role].Milliseconds()))
	}
	return strings.Join(parts, ", ")
}

// spanLine is spans in key order, each under label(key): "0 12-40ms 1 ...".
func spanLine(spans map[string][2]time.Duration, label func(string) string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(spans)) {
		parts = append(parts, fmt.Sprintf("%s %d-%dms", label(k), spans[k][0].Milliseconds(), spans[k][1].Milliseconds()))
	}
	return strings.Join(parts, " ")
}

// shardLine is spans by output-head shard, each under its number.
func shardLine(spans map[string][2]time.Duration) string {
	return spanLine(spans, func(shard string) string { return shard[strings.LastIndex(shard, "-")+1:] })
}
