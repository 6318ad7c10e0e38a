package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Options are what every scenario shares.
type Options struct {
	// Env is the management cluster to run on. Required.
	Env *Env
	// ServerArgs and ServerEnv are extra flags and environment for the
	// server; LogLevel its log level (default info).
	ServerArgs []string
	ServerEnv  []string
	LogLevel   string
	// During, if set, runs on its own goroutine while the scenario's
	// measured phase runs (to take profiles); its context ends with the
	// phase.
	During func(ctx context.Context, s *Server)
	// Logf reports progress; default silent.
	Logf func(format string, args ...any)
	// Parallel is how many registrations run at once; default 32.
	Parallel int
}

func (o *Options) check() error {
	if o.Env == nil {
		return errors.New("fleet scenario: env is required")
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Parallel == 0 {
		o.Parallel = 32
	}
	return nil
}

func (o *Options) startServer(ctx context.Context, name string) (*Server, error) {
	return o.Env.StartServer(ctx, name, func(c *ServerConfig) {
		c.Args, c.Env, c.LogLevel = o.ServerArgs, o.ServerEnv, o.LogLevel
	})
}

// during runs o.During for the measured phase; the returned func ends it
// and waits.
func (o *Options) during(ctx context.Context, s *Server) func() {
	if o.During == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); o.During(ctx, s) }()
	return func() { cancel(); <-done }
}

// registerFleet registers n clusters named prefix-i and waits until the
// server has recorded every mint in its audit log, so that the work of
// auditing mints (one patch each) is not counted in what follows.
func (o *Options) registerFleet(ctx context.Context, prefix string, n int) (members []Member, registered, audited time.Duration, err error) {
	start := time.Now()
	members, err = o.Env.Mgmt.Register(ctx, ClusterNames(prefix, n), time.Hour, o.Parallel)
	if err != nil {
		return nil, 0, 0, err
	}
	registered = time.Since(start)
	o.Logf("registered %d clusters in %s; waiting for the server to audit the mints", n, registered.Round(time.Millisecond))
	for {
		left, err := o.Env.Mgmt.UnauditedTokens(ctx)
		if err != nil {
			return nil, 0, 0, err
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, 0, 0, fmt.Errorf("%d token mints not audited: %w", left, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	audited = time.Since(start) - registered
	o.Logf("the server audited every mint %s after registration ended", audited.Round(time.Millisecond))
	return members, registered, audited, nil
}

// cpuPids are the processes a scenario's CPU is measured on: the server,
// the management API server and etcd, and this process (the agents).
func (o *Options) cpuPids(s *Server) map[string]int {
	pids := o.Env.Pids()
	pids["server"] = s.Pid()
	pids["harness"] = 0
	return pids
}

// linesBetween reads the server's log lines written in [from, to].
func linesBetween(s *Server, from, to time.Time) ([]LogLine, error) {
	return ReadLog(s.LogPath(), from, func(l LogLine) bool { return l.Time.IsZero() || !l.Time.After(to) })
}

// subAPI subtracts two APIRequests readings, dropping zero entries.
func subAPI(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
