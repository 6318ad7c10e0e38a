package catest

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// Binary returns the path of a pinned third-party binary that `make tools`
// builds into .cache/bin of the repository (cfssl, step-ca). A missing
// binary fails the test, it does not skip it: CI must never pass without
// exercising the real component.
func Binary(t testing.TB, name string) string {
	t.Helper()
	localcluster.SkipIfShort(t)
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatalf("catest: %v", err)
	}
	p := filepath.Join(root, ".cache", "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("catest: %s not built: run `make tools` (or `hack/tools.sh %s`): %v", name, name, err)
	}
	return p
}

// FreeAddr returns a loopback host:port that nothing listened on a moment
// ago. The port may be taken before the caller binds it; callers that start
// a server on it retry with a fresh one if it does not come up.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("catest: free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("catest: free port: %v", err)
	}
	return addr
}

// Process is a third-party server a test started; it is stopped when the
// test ends.
type Process struct {
	p   *localcluster.Process
	log string
}

// StartProcess runs bin with args, its output going to dir/<name>.log, and
// stops it (SIGTERM, then SIGKILL) when the test ends. The process dies
// with the test binary even if the cleanup never runs. Give it absolute
// paths: it runs in the test's working directory.
func StartProcess(t testing.TB, name, bin string, args []string, dir string) *Process {
	t.Helper()
	localcluster.SkipIfShort(t)
	logPath := filepath.Join(dir, name+".log")
	p, err := localcluster.StartProcess(name, bin, args, logPath, false)
	if err != nil {
		t.Fatalf("catest: %v", err)
	}
	proc := &Process{p: p, log: logPath}
	t.Cleanup(func() {
		if err := p.Stop(5 * time.Second); err != nil {
			t.Errorf("catest: stop %s: %v", name, err)
		}
	})
	return proc
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	done, _ := p.p.Exited()
	return done
}

// Server is a third-party server for StartServer to run.
type Server struct {
	// Name names the process and its logs; Bin and Dir are as for
	// StartProcess.
	Name, Bin, Dir string
	// Args is the command line that makes the server listen on addr
	// (host:port). Each attempt calls it with a fresh address.
	Args func(addr string) []string
	// Scheme is http or https; Health the path that answers 200 OK once
	// the server is up.
	Scheme, Health string
	// Roots are the trust for https; nil for http.
	Roots *x509.CertPool
	// Timeout is how long an attempt may take to come up; default 30
	// seconds.
	Timeout time.Duration
}

// StartServer runs srv on a free loopback port, as StartProcess does, and
// waits until it is healthy. Another process may take the port FreeAddr
// gave before the server binds it, so a server that ends or does not come
// up is tried again on a fresh port, three times in all before the test
// fails with the end of its log. It returns the process and the server's
// base URL, scheme://host:port.
func StartServer(t testing.TB, srv Server) (*Process, string) {
	t.Helper()
	localcluster.SkipIfShort(t)
	if srv.Timeout == 0 {
		srv.Timeout = 30 * time.Second
	}
	for attempt := 1; ; attempt++ {
		addr := FreeAddr(t)
		proc := StartProcess(t, srv.Name+"-"+strconv.Itoa(attempt), srv.Bin, srv.Args(addr), srv.Dir)
		url := srv.Scheme + "://" + addr
		if proc.waitHealthy(url+srv.Health, srv.Roots, srv.Timeout) {
			return proc, url
		}
		if attempt == 3 {
			t.Fatalf("catest: %s did not come up on %s:\n%s", srv.Name, addr, proc.LogTail(t, 30))
		}
	}
}

// waitHealthy polls url until it answers 200 OK (true), or the process
// ends or timeout passes (false).
func (p *Process) waitHealthy(url string, roots *x509.CertPool, timeout time.Duration) bool {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && !p.Exited(); time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Get(url)
		if err != nil {
			continue
		}
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return true
		}
	}
	return false
}

// Log returns what the process wrote so far.
func (p *Process) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatalf("catest: read log: %v", err)
	}
	return string(b)
}

// LogTail returns the last n lines of the log, for failure messages.
func (p *Process) LogTail(t testing.TB, n int) string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(p.Log(t), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
