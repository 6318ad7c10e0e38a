package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/pace"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
)

// StormConfig is a bootstrap storm: Agents agents with fresh tokens start at
// once against one server.
type StormConfig struct {
	Options
	// Agents is the fleet size. Required.
	Agents int
	// Prefix names the clusters; default storm.
	Prefix string
	// Snapshot each agent pushes; the zero value is one mesh with one
	// Service of one pod.
	Snapshot SnapshotSpec
	// Timeout bounds the wait for every session; default 10 minutes.
	// Stall ends the wait early when no new session opened for that long
	// (agents whose token was used up without a certificate never will);
	// default 3 minutes (a refused agent backs off up to a minute, and the
	// server lets an address fail only six times a minute).
	Timeout, Stall time.Duration
	// StatusAfter is how long after the last session opened the
	// KubernetesCluster statuses are read; default 25s.
	StatusAfter time.Duration
	// LimitConcurrency is how many agents at a time the machine's own
	// handshake and signing limit is measured with, before the storm
	// (MeasureHandshakeLimit, as many agents as the storm); default 64;
	// negative: not measured.
	LimitConcurrency int
}

// StormResult is what a storm measured.
type StormResult struct {
	Agents int
	Hygiene
	// Registered is how long registering and minting took; MintsAudited
	// how long the server then took to audit every mint; Settled how long
	// after that the server, the apiserver and etcd went quiet for good
	// (what the registrations set off finished; the whole wait, and an
	// entry in Errors, if they never did) before the limit and the storm
	// were measured. None of them is part of the storm.
	Registered, MintsAudited, Settled time.Duration
	// Certified is token → certificate, Session token → first session,
	// per agent (those that got there).
	Certified, Session Summary
	// SessionAfterCertificate is certificate → first session, per agent
	// that got both: about how long the server's status writer must hold
	// a fresh certificate for the session's write to carry it
	// (server.StatusConfig's FirstSessionWait). A lower bound: the server
	// counts from the first Bootstrap it answered, earlier than the
	// certificate the agent accepted when an answer was lost.
	SessionAfterCertificate Summary
	// AllCertified and AllSessions: storm start → the last agent.
	AllCertified, AllSessions time.Duration
	// NotConnected agents had no session when the wait ended;
	// NotConnectedErrors are their last errors, by message.
	NotConnected       int
	NotConnectedErrors map[string]int
	// BootstrapAttempts over the fleet (Agents if none was retried);
	// BootstrapErrors counts the last error of agents that retried, by
	// message.
	BootstrapAttempts int
	BootstrapErrors   map[string]int
	// CPU used from the storm's start until the last session opened
	// (sampled every 500ms, so up to that much later).
	CPU CPUWindow
	// APIRequests the management API server served in the same window.
	APIRequests map[string]float64
	// Status is the KubernetesCluster statuses StatusAfter after the last
	// session opened.
	Status StatusCheck
	// QueueFull counts "status queue full; dropping update" warnings in the
	// server's whole log; Logs counts the server's lines from the storm's
	// start to the status check, by level and message.
	QueueFull int
	Logs      map[string]int
	// Throttled is client-go's own account, in the same lines, of requests
	// its rate limiter held back.
	Throttled Throttled
	// ServerAfter is the server's usage after the status check.
	ServerAfter ProcUsage
	// Limit is this machine's own handshake and signing limit, measured
	// in the same run just before the storm (the fleet registered);
	// LimitBackground is what the server, the apiserver and etcd used
	// meanwhile (the limit shares the cores with them). Rate is the
	// storm's sessions per second (agents over AllSessions), RateOfLimit
	// Rate / Limit.PerSecond; both zero unless every agent got a session.
	// CPUPerAgent is the server's, the apiserver's and etcd's CPU over
	// the storm per agent, AllCPUPerAgent the same with the agents' own
	// (comparable with Limit.CPUPerAgent, which counts both sides).
	Limit                       HandshakeLimit
	LimitBackground             CPUWindow
	Rate, RateOfLimit           float64
	CPUPerAgent, AllCPUPerAgent time.Duration
	// Quiet is how long after the status check the last write the storm
	// set off reached the management apiserver (writesSettle: the
	// mirror's objects, statuses, grants, ledger shards; zero if none came
	// after the check); ToQuiet the CPU from the storm's start until that
	// write was seen (with the harness's own reads since: a LIST of the
	// clusters, scrapes of the server's and the apiserver's metrics), and
	// APIRequestsToQuiet the requests the apiserver served by then.
	// CPUToQuietPerAgent is ToQuiet's server, apiserver and etcd over the
	// agents. Unlike CPUPerAgent, which stops at the last session, it
	// counts the same work at every fleet size: a small storm ends before
	// most of what it set off is written. Zero (and an entry in Errors) if
	// the writes never stopped.
	Quiet              time.Duration
	ToQuiet            CPUWindow
	APIRequestsToQuiet map[string]float64
	CPUToQuietPerAgent time.Duration
	// Refused counts the connections the server's relay gate closed during
	// the storm, by reason (relaymesh_relay_connections_refused_total):
	// "preauth_limit" and its kin before the handshake, "handshake" those
	// whose handshake failed or ran out of time.
	Refused map[string]float64
	// Errors are measurements that could not be taken (an API server too
	// busy to answer), the rest of the result stands.
	Errors []string
}

// StatusCheck compares KubernetesCluster statuses with the agents.
type StatusCheck struct {
	After time.Duration
	Total int
	// Connected say connected: true; NoStatus have no status at all;
	// SerialMatches name the certificate the agent holds; Correct say what
	// is true: an agent with a session is connected with the certificate
	// it holds, one without a session is not connected.
	Connected, NoStatus, SerialMatches, Correct int
}

// Storm runs a bootstrap storm.
func Storm(ctx context.Context, cfg StormConfig) (*StormResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Agents < 1 {
		return nil, errors.New("storm: agents must be at least 1")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "storm"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.Stall == 0 {
		cfg.Stall = 3 * time.Minute
	}
	if cfg.StatusAfter == 0 {
		cfg.StatusAfter = 25 * time.Second
	}
	if cfg.LimitConcurrency == 0 {
		cfg.LimitConcurrency = 64
	}
	srv, err := cfg.startServer(ctx, cfg.Prefix+"-server")
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	r := &StormResult{Agents: cfg.Agents, BootstrapErrors: map[string]int{}, NotConnectedErrors: map[string]int{}}
	members, reg, audited, err := cfg.registerFleet(ctx, cfg.Prefix, cfg.Agents)
	if err != nil {
		return nil, err
	}
	r.Registered, r.MintsAudited = reg, audited
	roots, err := cfg.Env.Mgmt.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	f, err := NewFleet(FleetConfig{Servers: []string{srv.Addr}, Roots: roots, Members: members,
		Snapshot: func(c string) *relaypb.Snapshot { return cfg.Snapshot.Snapshot(c) }})
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	// What the registrations set off (translations, trust reconciles, grant
	// statuses) must not share the limit's or the storm's window.
	settled, quiet, err := settle(ctx, cfg.cpuPids(srv), settleWindow, settleQuiet, settleMax)
	if err != nil {
		return nil, err
	}
	r.Settled = settled
	if quiet {
		cfg.Logf("storm: the server, apiserver and etcd quiet %s after the mints were audited", settled.Round(time.Millisecond))
	} else {
		msg := fmt.Sprintf("the server, the apiserver and etcd did not go quiet within %s of the registrations; the limit and the storm share the cores with what they still did", settleMax)
		r.Errors = append(r.Errors, msg)
		cfg.Logf("storm: %s", msg)
	}
	apiBefore, err := cfg.Env.Mgmt.APIRequests(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.LimitConcurrency > 0 {
		// Before the storm: the server idles with the fleet registered
		// (after it, the server and the apiserver still mirror and write
		// statuses, and the measurement would share the cores with them).
		cfg.Logf("storm: measuring this machine's handshake and signing limit: %d agents, %d at a time", cfg.Agents, cfg.LimitConcurrency)
		if err := measureLimit(ctx, &cfg, srv, r); err != nil {
			r.Errors = append(r.Errors, "the machine's handshake and signing limit: "+err.Error())
		}
	}
	metricsBefore, err := srv.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	stop := cfg.during(ctx, srv)
	cfg.Logf("storm: starting %d agents at once", cfg.Agents)
	pids := cfg.cpuPids(srv)
	meter, err := StartCPU(pids)
	if err != nil {
		return nil, err
	}
	whole, err := StartCPU(pids)
	if err != nil {
		return nil, err
	}
	start := f.Start(ctx)
	// Wait until every agent has a session, the fleet stalls, or Timeout;
	// keep the CPU used up to the latest new session.
	deadline, progress, connected := start.Add(cfg.Timeout), start, 0
	var waitErr error
	for {
		n := 0
		for _, a := range f.Agents() {
			if !a.State().Timeline.Session.IsZero() {
				n++
			}
		}
		now := time.Now()
		if n > connected {
			connected, progress = n, now
			if r.CPU, err = meter.Stop(); err != nil {
				return nil, err
			}
		}
		if n == cfg.Agents {
			break
		}
		if now.After(deadline) || now.Sub(progress) > cfg.Stall {
			waitErr = fmt.Errorf("%d of %d agents have no session; the last new one opened %s ago", cfg.Agents-n, cfg.Agents, now.Sub(progress).Round(time.Second))
			break
		}
		select {
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	stop()
	if m, err := srv.Metrics(ctx); err != nil {
		r.Errors = append(r.Errors, "the server's metrics after the storm: "+err.Error())
	} else {
		r.Refused = refusedByReason(m.Sub(metricsBefore))
	}
	// An overloaded API server may not answer now; the storm's own
	// numbers are kept either way.
	if apiAfter, err := cfg.Env.Mgmt.APIRequests(ctx); err != nil {
		r.Errors = append(r.Errors, "API request counts after the storm: "+err.Error())
	} else {
		r.APIRequests = subAPI(apiAfter, apiBefore)
	}
	if waitErr != nil {
		cfg.Logf("storm: %v", waitErr)
	}
	var certified, session, gap []time.Duration
	states := f.States()
	for _, st := range states {
		tl := st.Timeline
		r.BootstrapAttempts += st.BootstrapAttempts
		if st.BootstrapAttempts > 1 && st.LastError != nil {
			r.BootstrapErrors[ErrorKind(st.LastError)]++
		}
		if !tl.Certified.IsZero() {
			certified = append(certified, tl.Certified.Sub(tl.Started))
			r.AllCertified = max(r.AllCertified, tl.Certified.Sub(start))
		}
		if tl.Session.IsZero() {
			r.NotConnected++
			if st.LastError != nil {
				r.NotConnectedErrors[ErrorKind(st.LastError)]++
			}
			continue
		}
		session = append(session, tl.Session.Sub(tl.Started))
		if !tl.Certified.IsZero() {
			gap = append(gap, tl.Session.Sub(tl.Certified))
		}
		r.AllSessions = max(r.AllSessions, tl.Session.Sub(start))
	}
	r.Certified, r.Session, r.SessionAfterCertificate = Summarize(certified), Summarize(session), Summarize(gap)
	cfg.Logf("storm: %d agents: certified %s; session %s (after the certificate %s); all sessions after %s", cfg.Agents, r.Certified, r.Session,
		r.SessionAfterCertificate, r.AllSessions.Round(time.Millisecond))

	cfg.Logf("storm: reading KubernetesCluster statuses in %s", cfg.StatusAfter)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(cfg.StatusAfter):
	}
	if r.Status, err = checkStatus(ctx, cfg.Env.Mgmt, f); err != nil {
		r.Errors = append(r.Errors, "KubernetesCluster statuses: "+err.Error())
	}
	r.Status.After = cfg.StatusAfter
	lines, err := linesBetween(srv, start, time.Now())
	if err != nil {
		return nil, err
	}
	r.Logs, r.Throttled = LogCounts(lines), ThrottledOf(lines)
	all, err := ReadLog(srv.LogPath(), time.Time{}, func(l LogLine) bool { return l.Msg == "status queue full; dropping update" })
	if err != nil {
		return nil, err
	}
	r.QueueFull = len(all)
	if r.ServerAfter, err = srv.Usage(); err != nil {
		return nil, err
	}
	// The agents stay connected while what the storm set off is written:
	// the end is the last write to the management apiserver (an idle fleet
	// of 10,000 still uses a quarter of a core on its pings, so the CPU
	// never falls quiet).
	toQuiet, err := whole.Stop()
	if err != nil {
		return nil, err
	}
	quietAfter, wentQuiet, apiQuiet, err := writesSettle(ctx, cfg.Env.Mgmt.APIRequests, writesEvery, writesQuiet, quietMax, func() error {
		var err error
		toQuiet, err = whole.Stop()
		return err
	})
	switch {
	case err != nil:
		// The storm's own numbers stand without these.
		r.Errors = append(r.Errors, "the storm's last write: "+err.Error())
	case wentQuiet:
		r.Quiet, r.ToQuiet, r.APIRequestsToQuiet = quietAfter, toQuiet, subAPI(apiQuiet, apiBefore)
	default:
		r.Errors = append(r.Errors, fmt.Sprintf("the management apiserver was still written to %s after the status check", quietMax))
	}
	f.Stop()
	if r.NotConnected == 0 && r.AllSessions > 0 {
		r.Rate = float64(cfg.Agents) / r.AllSessions.Seconds()
		for _, p := range []string{"server", "apiserver", "etcd"} {
			r.CPUPerAgent += r.CPU.CPU[p]
		}
		r.AllCPUPerAgent = (r.CPUPerAgent + r.CPU.CPU["harness"]) / time.Duration(cfg.Agents)
		r.CPUPerAgent /= time.Duration(cfg.Agents)
		if r.Limit.PerSecond > 0 {
			r.RateOfLimit = r.Rate / r.Limit.PerSecond
		}
		if r.ToQuiet.Wall > 0 {
			for _, p := range []string{"server", "apiserver", "etcd"} {
				r.CPUToQuietPerAgent += r.ToQuiet.CPU[p]
			}
			r.CPUToQuietPerAgent /= time.Duration(cfg.Agents)
			cfg.Logf("storm: quiet %s after the status check; CPU per agent until then: server + apiserver + etcd %s",
				r.Quiet.Round(time.Millisecond), r.CPUToQuietPerAgent.Round(10*time.Microsecond))
		}
		cfg.Logf("storm: %.0f sessions/s, %.2f of the machine's limit (%.0f agents/s, %s CPU each, agent and server); CPU per agent: server + apiserver + etcd %s, with the agents %s",
			r.Rate, r.RateOfLimit, r.Limit.PerSecond, r.Limit.CPUPerAgent.Round(10*time.Microsecond), r.CPUPerAgent.Round(10*time.Microsecond), r.AllCPUPerAgent.Round(10*time.Microsecond))
	} else {
		r.Errors = append(r.Errors, fmt.Sprintf("no storm rate: %d of %d agents have no session", r.NotConnected, cfg.Agents))
	}
	if r.Hygiene, err = srv.CheckHygiene(members); err != nil {
		return nil, err
	}
	return r, nil
}

// measureLimit measures this machine's handshake and signing limit into r,
// with the CPU the server, the apiserver and etcd used meanwhile.
func measureLimit(ctx context.Context, cfg *StormConfig, srv *Server, r *StormResult) error {
	pids := cfg.cpuPids(srv)
	delete(pids, "harness") // the measurement itself
	meter, err := StartCPU(pids)
	if err != nil {
		return err
	}
	if r.Limit, err = MeasureHandshakeLimit(ctx, cfg.Agents, cfg.LimitConcurrency); err != nil {
		return err
	}
	if r.LimitBackground, err = meter.Stop(); err != nil {
		return err
	}
	cfg.Logf("storm: the machine's limit: %.0f agents/s, %s CPU each (agent and server); meanwhile server, apiserver, etcd used %s",
		r.Limit.PerSecond, r.Limit.CPUPerAgent.Round(10*time.Microsecond), r.LimitBackground.Total().Round(time.Millisecond))
	return nil
}

// A fleet's processes are quiet when together they use less than
// settleShare of one core in every settleWindow for settleQuiet: longer
// than the longest pause the server's loops take between two runs
// (pace.DefaultCap), so a pause is not taken for the end of the work.
// settle waits at most settleMax for that.
const (
	settleShare  = 0.1
	settleWindow = time.Second
	settleQuiet  = pace.DefaultCap + time.Second
	settleMax    = 2 * time.Minute
	// After a storm its writes are done when none (writesSettle) came
	// for writesQuiet, read every writesEvery (a scrape of the apiserver's
	// metrics costs it a few tens of milliseconds of CPU), waited for at
	// most quietMax: at 10,000 agents the mirror writes 30,000 objects at
	// the client budget after the last session.
	writesEvery = 2 * time.Second
	writesQuiet = 10 * time.Second
	quietMax    = 10 * time.Minute
)

// writesSettle waits until the apiserver whose request counts read
// returns (Management.APIRequests) has served no write but the periodic
// ones (the replicas' Lease renewals, the apiserver's own endpoints) for
// quietFor, reading every interval, or longest passes. It returns when
// the last write was seen, from the call (zero: none after the first
// reading; the whole wait if the writes never stopped), whether they
// stopped, and the counts read when the last write was seen. busy, if set,
// is called whenever new writes are seen.
func writesSettle(ctx context.Context, read func(context.Context) (map[string]float64, error), every, quietFor, longest time.Duration, busy func() error) (time.Duration, bool, map[string]float64, error) {
	start := time.Now()
	last, lastWrites := start, -1.0
	var atLast map[string]float64
	for {
		counts, err := read(ctx)
		if err != nil {
			return 0, false, nil, err
		}
		now := time.Now()
		if w := stormWrites(counts); w != lastWrites {
			if lastWrites >= 0 {
				last = now
				if busy != nil {
					if err := busy(); err != nil {
						return 0, false, nil, err
					}
				}
			}
			lastWrites, atLast = w, counts
		}
		if now.Sub(last) >= quietFor {
			return last.Sub(start), true, atLast, nil
		}
		if now.Sub(start) > longest {
			return now.Sub(start), false, atLast, nil
		}
		select {
		case <-ctx.Done():
			return 0, false, nil, ctx.Err()
		case <-time.After(every):
		}
	}
}

// stormWrites sums the writes in counts (APIRequests) but the periodic
// ones: Lease renewals and the apiserver's own endpoints.
func stormWrites(counts map[string]float64) float64 {
	var n float64
	for key, v := range counts {
		verb, resource, _ := strings.Cut(key, " ")
		switch verb {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
		default:
			continue
		}
		if r, _, _ := strings.Cut(resource, "/"); r == "leases" || r == "endpoints" || r == "endpointslices" {
			continue
		}
		n += v
	}
	return n
}

// settle waits until the processes pids (the harness excluded) together
// use less than settleShare of a core in every window for quietFor, or
// longest passes. It returns when the quiet began (from the call; the
// whole wait if it never did) and whether it did.
func settle(ctx context.Context, pids map[string]int, window, quietFor, longest time.Duration) (time.Duration, bool, error) {
	pids = maps.Clone(pids)
	delete(pids, "harness")
	start := time.Now()
	var quietSince time.Time
	for {
		meter, err := StartCPU(pids)
		if err != nil {
			return 0, false, err
		}
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(window):
		}
		w, err := meter.Stop()
		if err != nil {
			return 0, false, err
		}
		now := time.Now()
		switch {
		case float64(w.Total()) >= settleShare*float64(w.Wall):
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = now.Add(-w.Wall)
		}
		if !quietSince.IsZero() && now.Sub(quietSince) >= quietFor {
			return quietSince.Sub(start), true, nil
		}
		if now.Sub(start) > longest {
			return now.Sub(start), false, nil
		}
	}
}

// checkStatus reads every KubernetesCluster of the fleet and compares it
// with its agent.
func checkStatus(ctx context.Context, m *Management, f *Fleet) (StatusCheck, error) {
	statuses, err := m.ClusterStatuses(ctx)
	if err != nil {
		return StatusCheck{}, err
	}
	var c StatusCheck
	for _, a := range f.Agents() {
		st, ok := statuses[a.Cluster()]
		if !ok {
			return c, fmt.Errorf("KubernetesCluster %s is missing", a.Cluster())
		}
		c.Total++
		if !st.HasStatus {
			c.NoStatus++
		}
		if st.Connected {
			c.Connected++
		}
		agent := a.State()
		match := st.Serial != "" && st.Serial == agent.Serial
		if match {
			c.SerialMatches++
		}
		if agent.Connected && st.Connected && match || !agent.Connected && !st.Connected {
			c.Correct++
		}
	}
	return c, nil
}

// refusedByReason is the connections the relay gate refused in m (a
// difference of two scrapes), by reason.
func refusedByReason(m Metrics) map[string]float64 {
	out := map[string]float64{}
	for series, v := range m {
		base, labels, _ := strings.Cut(series, "{")
		if base != server.MetricConnsRefused || v == 0 {
			continue
		}
		reason := parseLabels(strings.TrimSuffix(labels, "}"))["reason"]
		if reason == "" {
			reason = "unknown"
		}
		out[reason] += v
	}
	return out
}

// addrInError is an address in an error's message: an IPv4 address with
// or without its port, or a bracketed IPv6 one (with its zone) and its
// port.
var addrInError = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\[[^\]\s]+\]:\d+\b`)

// ErrorKind is err's message with every address (and port) replaced by
// ADDR, cut to 160 bytes: the agents' errors then group by what went wrong,
// not one group per agent whose address the message names (a storm's
// "read tcp 127.64.1.48:48963->127.0.0.1:35763: ..." once for each agent).
func ErrorKind(err error) string {
	return truncate(addrInError.ReplaceAllString(err.Error(), "ADDR"), 160)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
