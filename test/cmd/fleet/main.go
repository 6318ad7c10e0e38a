// Command fleet runs the fleet scenarios of test/fleet by hand, at any
// size, against any relaymesh binary, and prints each result as JSON:
//
//	go run ./test/cmd/fleet -bin /work/baseline/relaymesh -dir /tmp/fleet storm -agents 1000 -status-after 25s
//	go run ./test/cmd/fleet -bin ./relaymesh issuance -concurrency 1,4,16 -duration 10s
//	go run ./test/cmd/fleet idle -agents 1000
//	go run ./test/cmd/fleet config -clusters 100 -edits 5
//	go run ./test/cmd/fleet snapshot
//	go run ./test/cmd/fleet large -namespaces 500 -pushes 2 -mirrored 5m
//	go run ./test/cmd/fleet failover -agents 1000 -replicas 3
//	go run ./test/cmd/fleet lifetime -agents 1000 -agent-cert-ttl 5m -issuer-ttl 20m
//
// Each run starts its own management cluster (etcd and a kube-apiserver
// from `make tools`) and server, and stops them at the end; -dir keeps
// their logs and audit logs. With -pprof ADDR the server is started with
// RELAYMESH_FLEET_PPROF=ADDR, which a profiling build of relaymesh (see
// docs/benchmarks.md, "Fleet") serves net/http/pprof on; CPU profiles and
// goroutine dumps of every measured phase are then written to -dir, with a
// CPU profile of the management kube-apiserver over the same span.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/fleet"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const usage = `Usage: fleet [flags] SCENARIO [scenario flags]

Scenarios:
  storm     bootstrap storm: -agents agents with fresh tokens start at once
  issuance  Identity.Renew vs cfssl serve vs step-ca vs x509, same requests
  idle      server RSS, heap and goroutines per connected idle agent
  config    issue 21: mirror, policy edit reaching every agent, deregistration
  snapshot  the largest snapshot an agent can send
  large     one cluster's 100,000-pod snapshot (500 namespaces) pushed, then changed ones: time, server CPU and RSS
  failover  issue 22: SIGKILL the busiest replica, then the Lease holder; time until their agents resync
  lifetime  issue 30: issuing-CA renewals and a relay root rotation in minutes, the Lease holder killed mid-rotation

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	bin := fs.String("bin", "", "relaymesh binary to measure (default $"+fleet.BinaryEnv+", else one built from this checkout)")
	dir := fs.String("dir", "", "keep cluster data, logs, audit logs and profiles here (default: a temporary directory, removed)")
	out := fs.String("json", "", "also write the result to this file")
	logLevel := fs.String("log-level", "info", "the server's --log-level")
	pprofAddr := fs.String("pprof", "", "profile the server (start it with RELAYMESH_FLEET_PPROF=ADDR: a profiling build serves pprof there) and the management kube-apiserver, each measured phase")
	pprofSecs := fs.Int("pprof-seconds", 10, "length of each CPU profile")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("a scenario is required")
	}
	scenario, scenarioArgs := fs.Arg(0), fs.Args()[1:]
	workDir := *dir
	if workDir == "" {
		d, err := os.MkdirTemp("", "fleet-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		workDir = d
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
	run, err := scenarioFor(scenario, scenarioArgs, stderr)
	if err != nil {
		return err
	}
	env, err := fleet.StartEnv(ctx, fleet.EnvConfig{Dir: workDir, Binary: *bin, Profiling: *pprofAddr != ""})
	if err != nil {
		return err
	}
	defer env.Stop()
	logf("binary %s, open-file limit %d, work in %s", env.Binary, env.FileLimit, workDir)
	opts := fleet.Options{Env: env, Logf: logf, LogLevel: *logLevel}
	if *pprofAddr != "" {
		opts.ServerEnv = []string{"RELAYMESH_FLEET_PPROF=" + *pprofAddr}
		opts.During = profiler(*pprofAddr, env.Cluster.RESTConfig(), filepath.Join(workDir, "profiles", scenario), time.Duration(*pprofSecs)*time.Second, logf)
	}
	result, err := run(ctx, opts)
	if err != nil {
		return err
	}
	js, err := json.MarshalIndent(result, "", "  ")
	if err != nil {
		return err
	}
	if *out != "" {
		if err := os.WriteFile(*out, js, 0o600); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(stdout, "%s\n", js)
	return err
}

type scenarioFunc func(ctx context.Context, o fleet.Options) (any, error)

func scenarioFor(name string, args []string, stderr io.Writer) (scenarioFunc, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f scenarioFunc
	switch name {
	case "storm":
		agents := fs.Int("agents", 200, "fleet size")
		statusAfter := fs.Duration("status-after", 25*time.Second, "wait after the last session before statuses are read")
		timeout := fs.Duration("timeout", 10*time.Minute, "bound on the wait for every session")
		stall := fs.Duration("stall", 3*time.Minute, "end the wait when no new session opened for this long")
		services := fs.Int("services", 1, "Services in each agent's snapshot")
		limitConc := fs.Int("limit-concurrency", 64, "agents at a time when this machine's own handshake and signing limit is measured before the storm (as many agents as the storm; negative: not measured)")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			return fleet.Storm(ctx, fleet.StormConfig{Options: o, Agents: *agents, StatusAfter: *statusAfter, Timeout: *timeout, Stall: *stall,
				Snapshot: fleet.SnapshotSpec{Services: *services}, LimitConcurrency: *limitConc})
		}
	case "issuance":
		conc := fs.String("concurrency", "1,4,16", "concurrency levels")
		dur := fs.Duration("duration", 10*time.Second, "measured window per level")
		backends := fs.String("backends", "relaymesh,cfssl,step-ca,step-ca-badgerv2,x509", "back ends, in order")
		csrs := fs.Int("csrs", 256, "size of the request pool")
		statusAfter := fs.Duration("status-after", 5*time.Second, "wait after the last Renew before statuses are compared")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			var levels []int
			for _, s := range strings.Split(*conc, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 {
					return nil, fmt.Errorf("-concurrency: %q is not a positive number", s)
				}
				levels = append(levels, n)
			}
			return fleet.Issuance(ctx, fleet.IssuanceConfig{Options: o, Concurrency: levels, Duration: *dur, CSRs: *csrs, StatusAfter: *statusAfter, Backends: strings.Split(*backends, ",")})
		}
	case "idle":
		agents := fs.Int("agents", 1000, "fleet size")
		settle := fs.Duration("settle", 30*time.Second, "idle time before, and then during, the measurement")
		noSnap := fs.Bool("no-snapshot", false, "open no Push stream: the cost of the session alone")
		policy := fs.String("policy", "", "if set, a TrafficPolicy without selectors with this request timeout, so every agent holds an output set")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			return fleet.Idle(ctx, fleet.IdleConfig{Options: o, Agents: *agents, Settle: *settle, Policy: *policy, NoSnapshot: *noSnap})
		}
	case "config":
		clusters := fs.Int("clusters", 100, "fleet size")
		edits := fs.Int("edits", 5, "policy edits")
		replicas := fs.Int("replicas", 1, "server replicas (agents spread over them; translations read from the Lease holder's log)")
		settle := fs.Duration("settle", 0, "idle time after the policy first reached every agent, before the first edit (0: edit at once, while the just-connected fleet's status writes land; > 45s: a settled fleet)")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			return fleet.ConfigPlane(ctx, fleet.ConfigPlaneConfig{Options: o, Clusters: *clusters, Edits: *edits, Replicas: *replicas, Settle: *settle})
		}
	case "snapshot":
		pods := fs.Int("pods-per-service", 10, "ready pods behind each Service")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			return fleet.SnapshotLimit(ctx, fleet.SnapshotLimitConfig{Options: o, PodsPerService: *pods})
		}
	case "large":
		namespaces := fs.Int("namespaces", 500, "namespaces of the cluster, each 200 pods, 20 Deployments and 20 Services")
		pushes := fs.Int("pushes", 2, "changed snapshots pushed after the first")
		mirrored := fs.Duration("mirrored", 0, "if set, then wait up to this long for the server to write all the cluster's discovered objects, and read its RSS again")
		settle := fs.Duration("settle", 0, "with -mirrored: then leave the server alone this long and read its RSS a third time (2m30s sees the runtime's forced collection)")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			if *namespaces < 1 || *pushes < 1 {
				return nil, fmt.Errorf("-namespaces and -pushes must be at least 1")
			}
			if *settle < 0 || (*settle > 0 && *mirrored <= 0) {
				return nil, fmt.Errorf("-settle needs -mirrored, and cannot be negative")
			}
			return fleet.LargeSnapshot(ctx, fleet.LargeSnapshotConfig{Options: o, Namespaces: *namespaces, Pushes: *pushes, Mirrored: *mirrored, Settle: *settle})
		}
	case "failover":
		agents := fs.Int("agents", 100, "fleet size")
		replicas := fs.Int("replicas", 3, "server replicas (at least 3)")
		perSecond := fs.Float64("per-second", 100, "agents started a second")
		steady := fs.Duration("steady", time.Minute, "window in which the apiserver's writes are counted with nothing failing")
		window := fs.Duration("window", 30*time.Second, "writes are counted from each kill over this window (at least until its measurement ends)")
		timeout := fs.Duration("timeout", 5*time.Minute, "bound on each wait")
		lease := fs.Duration("leader-lease-duration", 0, "the replicas' --leader-lease-duration (0: the server's default)")
		renew := fs.Duration("leader-renew-deadline", 0, "the replicas' --leader-renew-deadline (0: the server's default)")
		retry := fs.Duration("leader-retry-period", 0, "the replicas' --leader-retry-period (0: the server's default)")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			for flag, d := range map[string]time.Duration{"--leader-lease-duration": *lease, "--leader-renew-deadline": *renew, "--leader-retry-period": *retry} {
				if d != 0 {
					o.ServerArgs = append(o.ServerArgs, flag, d.String())
				}
			}
			return fleet.Failover(ctx, fleet.FailoverConfig{Options: o, Agents: *agents, Replicas: *replicas, PerSecond: *perSecond,
				Steady: *steady, Window: *window, Timeout: *timeout})
		}
	case "lifetime":
		agents := fs.Int("agents", 40, "fleet size")
		replicas := fs.Int("replicas", 3, "server replicas (at least 2)")
		perSecond := fs.Float64("per-second", 20, "agents started a second")
		agentTTL := fs.Duration("agent-cert-ttl", time.Minute, "the replicas' --agent-cert-ttl")
		issuerTTL := fs.Duration("issuer-ttl", 240*time.Second, "the replicas' --relay-issuer-ttl")
		renewAt := fs.Float64("issuer-renew-at", 0.35, "the replicas' --relay-issuer-renew-at")
		check := fs.Duration("check-interval", 2*time.Second, "the replicas' --relay-issuer-check-interval")
		grace := fs.Duration("root-grace", 0, "the replicas' --relay-root-grace (0: the server's default, the agent certificate lifetime + 2 checks)")
		renewals := fs.Int("renewals", 2, "issuing-CA renewals to see")
		killIn := fs.String("kill-in", "Switching", "rotation phase in which the Lease holder is killed (AddingNewRoot, Switching or RemovingOldRoot)")
		killAfter := fs.Duration("kill-after", 5*time.Second, "how long into that phase")
		reopen := fs.Duration("reopen", time.Minute, "an agent longer than this without a session counts as lost")
		timeout := fs.Duration("timeout", 30*time.Minute, "bound on the run from the fleet's start")
		f = func(ctx context.Context, o fleet.Options) (any, error) {
			return fleet.Lifetime(ctx, fleet.LifetimeConfig{Options: o, Agents: *agents, Replicas: *replicas, PerSecond: *perSecond,
				AgentCertTTL: *agentTTL, IssuerTTL: *issuerTTL, IssuerRenewAt: *renewAt, CheckInterval: *check, RootGrace: *grace,
				Renewals: *renewals, KillIn: ca.RootPhase(*killIn), KillAfter: *killAfter, Reopen: *reopen, Timeout: *timeout})
		}
	default:
		return nil, fmt.Errorf("unknown scenario %q: want storm, issuance, idle, config, snapshot, large, failover or lifetime", name)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return f, nil
}

// profiler collects, for every measured phase, a goroutine dump two
// seconds in and a CPU profile of the given length from the server's pprof
// endpoint at addr, and a CPU profile of the same span from the management
// kube-apiserver (its /debug/pprof, through mgmt, an admin config), into
// dir: the apiserver's share of a phase's CPU is often the larger.
func profiler(addr string, mgmt *rest.Config, dir string, cpu time.Duration, logf func(string, ...any)) func(ctx context.Context, s *fleet.Server) {
	var phase atomic.Int64
	return func(ctx context.Context, _ *fleet.Server) {
		n := phase.Add(1)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			logf("pprof: %v", err)
			return
		}
		apiDone := make(chan struct{})
		go func() {
			defer close(apiDone)
			path := filepath.Join(dir, fmt.Sprintf("phase%d-apiserver-cpu.pprof", n))
			if err := fetchAPIServer(mgmt, cpu, path); err != nil {
				logf("pprof: apiserver cpu profile: %v", err)
				return
			}
			logf("pprof: wrote %s", path)
		}()
		cpuDone := make(chan struct{})
		go func() {
			defer close(cpuDone)
			// The CPU profile runs its full length even if the phase ends
			// sooner: pprof sends nothing before it is done.
			path := filepath.Join(dir, fmt.Sprintf("phase%d-cpu.pprof", n))
			if err := fetch(context.Background(), fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(cpu.Seconds())), path, cpu+30*time.Second); err != nil {
				logf("pprof: cpu profile: %v", err)
				return
			}
			logf("pprof: wrote %s", path)
		}()
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
			for _, p := range []struct{ name, url string }{
				{"goroutines.txt", "/debug/pprof/goroutine?debug=2"},
				{"block.pprof", "/debug/pprof/block"},
				{"mutex.pprof", "/debug/pprof/mutex"},
			} {
				path := filepath.Join(dir, fmt.Sprintf("phase%d-%s", n, p.name))
				if err := fetch(ctx, "http://"+addr+p.url, path, 30*time.Second); err != nil {
					logf("pprof: %s: %v", p.name, err)
				}
			}
		}
		<-cpuDone
		<-apiDone
	}
}

// fetchAPIServer writes a CPU profile of the kube-apiserver at cfg, cpu
// long, to path. Like the server's, it runs its full length even if the
// run is interrupted: the apiserver sends nothing before it is done.
func fetchAPIServer(cfg *rest.Config, cpu time.Duration, path string) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = cpu + 30*time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	b, err := kube.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(cpu.Seconds()))).DoRaw(context.Background())
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func fetch(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
