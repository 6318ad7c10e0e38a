package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Restart ends the named cluster's kube-apiserver with SIGKILL, as a crash
// would, and with withEtcd also the etcd every cluster of the environment
// shares (the API servers of the other clusters lose their store meanwhile
// and reconnect on their own); then it starts them again with the same
// flags, data, addresses and certificates and waits until the API server
// is ready. It returns how long the API server was unreachable (kill →
// ready). The ports stay free meanwhile: they are on the environment's
// own loopback address (serveAddr), which outgoing connections to
// loopback do not leave from (unless the machine could bind no address
// but 127.0.0.1).
func (e *Env) Restart(ctx context.Context, cluster string, withEtcd bool) (time.Duration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return 0, errors.New("localcluster: the environment is stopped")
	}
	c := e.Cluster(cluster)
	if c == nil {
		return 0, fmt.Errorf("localcluster: no cluster %q", cluster)
	}
	start := time.Now()
	if err := c.proc.Kill(); err != nil {
		return 0, err
	}
	if withEtcd {
		if err := e.etcd.Kill(); err != nil {
			return 0, err
		}
		p, err := e.etcd.again()
		if err != nil {
			return 0, err
		}
		e.etcd = p
		addr, err := clientAddr(p.cmd.Args)
		if err != nil {
			return 0, err
		}
		if err := waitPort(p, addr, 30*time.Second); err != nil {
			return 0, err
		}
	}
	logStart := LogSize(c.proc.log)
	p, err := c.proc.again()
	if err != nil {
		return 0, err
	}
	c.proc = p
	if err := waitReady(ctx, c, 90*time.Second); err != nil {
		if PortTaken(p.log, logStart) {
			// Its clients hold the URL, so the port cannot move: another
			// process bound it while the API server was down.
			err = fmt.Errorf("another process took its port %s while it was down: %w", c.URL, err)
		}
		return 0, fmt.Errorf("kube-apiserver %s after a restart (see %s): %w", cluster, p.log, err)
	}
	return time.Since(start), nil
}

// again starts an exited process anew with the same binary, arguments, log
// and detachment.
func (p *Process) again() (*Process, error) {
	if done, _ := p.Exited(); !done {
		return nil, fmt.Errorf("%s is still running", p.name)
	}
	detach := p.cmd.SysProcAttr != nil && p.cmd.SysProcAttr.Setsid
	return StartProcess(p.name, p.cmd.Path, p.cmd.Args[1:], p.log, detach)
}

// clientAddr is host:port of etcd's --listen-client-urls.
func clientAddr(args []string) (string, error) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen-client-urls="); ok {
			u, err := url.Parse(v)
			if err != nil {
				return "", err
			}
			return u.Host, nil
		}
	}
	return "", errors.New("localcluster: etcd has no --listen-client-urls")
}
