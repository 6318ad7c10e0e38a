package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPreAuthAgainstTheServerProcess measures what an unauthenticated peer
// costs the real `relaymesh server` process: its RSS under 200 concurrent
// 4 MiB Bootstrap calls, and its CPU under a 3-second HTTP/2 rapid-reset
// flood that reconnects every time it is cut off.
func TestPreAuthAgainstTheServerProcess(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt")
	mgmt := env.Cluster("mgmt")
	relayAddr, opsAddr := Addr(t), Addr(t)
	server := Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir+"/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr))
	waitHealthy(t, opsAddr)
	cs, err := mgmt.Clientset()
	require.NoError(t, err)
	root, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(root.Data["ca.crt"]))
	serverOnly := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "localhost"}
	pid := server.Pid()
	rssBefore := rssKiB(t, pid)

	// 200 concurrent 4 MiB calls, from 100 addresses (two streams each: an
	// unauthenticated connection carries two at a time).
	chunk := make([]byte, 16<<10)
	var mu sync.Mutex
	statuses := map[string]int{}
	var wg sync.WaitGroup
	// The sampler owns peak until it has returned (sampled is closed): the
	// test reads it only after that.
	peak := rssBefore
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				if r, ok := readRSSKiB(pid); ok {
					peak = max(peak, r)
				}
			}
		}
	}()
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := servertest.DialRaw(t, relayAddr, serverOnly, fmt.Sprintf("127.0.1.%d", i+1))
			if err != nil {
				mu.Lock()
				statuses["dial: "+err.Error()]++
				mu.Unlock()
				return
			}
			var ids []uint32
			for range 2 {
				id, err := r.Headers("/relaymesh.relay.v1.Identity/Bootstrap", false)
				if err != nil {
					continue
				}
				// The length prefix, and as much of the body as the
				// connection's flow-control window lets two streams send.
				_ = r.Data(id, servertest.GRPCHeader(4<<20), false)
				_ = r.Data(id, chunk, false)
				ids = append(ids, id)
			}
			for _, id := range ids {
				deadline := time.Now().Add(10 * time.Second)
				for r.Status(id) == "" && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				mu.Lock()
				statuses[r.Status(id)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	refused := statuses[strconv.Itoa(int(codes.ResourceExhausted))]
	t.Logf("200 concurrent 4 MiB pre-auth Bootstrap calls: %v; server RSS %d MiB before, peak %d MiB", statuses, rssBefore>>10, peak>>10)
	assert.Equal(t, 200, refused, "every oversized call is refused (ResourceExhausted)")
	assert.Less(t, peak-rssBefore, int64(100<<10), "the server did not buffer 800 MiB of messages")

	// From one address, at most MaxPreAuthPerAddress (16) connections are
	// even admitted.
	admitted := 0
	for range 40 {
		r, err := servertest.DialRaw(t, relayAddr, serverOnly, "127.0.2.1")
		if err == nil && !r.IsClosed(50*time.Millisecond) {
			admitted++
		}
	}
	t.Logf("one address opening 40 unauthenticated connections: %d admitted", admitted)
	assert.LessOrEqual(t, admitted, 16)

	// A rapid-reset flood for 3 seconds that reconnects whenever it is cut.
	cpuBefore := cpuSeconds(t, pid)
	start := time.Now()
	var streams, conns, refusedConns int
	for time.Since(start) < 3*time.Second {
		r, err := servertest.DialRaw(t, relayAddr, serverOnly, "127.0.3.1")
		if err != nil {
			refusedConns++
			continue
		}
		conns++
		for streams < 1e7 {
			id, err := r.Headers("/relaymesh.relay.v1.Identity/Bootstrap", false)
			if err == nil {
				err = r.Reset(id)
			}
			streams++
			if err != nil {
				break
			}
			select {
			case <-r.Closed():
				err = fmt.Errorf("closed")
			default:
			}
			if err != nil {
				break
			}
		}
		_ = r.Close()
	}
	elapsed := time.Since(start)
	cpu := cpuSeconds(t, pid) - cpuBefore
	t.Logf("3 s rapid-reset flood: %d HEADERS+RST_STREAM on %d connections, %d connections refused before the handshake; server CPU %.2f s (%.2f cores)",
		streams, conns, refusedConns, cpu, cpu/elapsed.Seconds())
	assert.Less(t, cpu/elapsed.Seconds(), 0.8, "the flood does not take the server's cores")
	assert.Less(t, streams, 5000, "an abusive address gets few streams")
	out, err := Run(t, bin, "audit", "verify", dir+"/audit.log")
	require.NoError(t, err, out)
}

// rssKiB is a process's resident set, from /proc.
func rssKiB(t *testing.T, pid int) int64 {
	n, ok := readRSSKiB(pid)
	if !ok {
		t.Fatalf("no VmRSS for pid %d", pid)
	}
	return n
}

// readRSSKiB is rssKiB for goroutines other than the test's, which must not
// call t.Fatalf: ok is false when /proc has no figure.
func readRSSKiB(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// cpuSeconds is a process's user and system CPU time, from /proc.
func cpuSeconds(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err := strconv.ParseFloat(f[11], 64)
	require.NoError(t, err)
	stime, err := strconv.ParseFloat(f[12], 64)
	require.NoError(t, err)
	return (utime + stime) / 100 // USER_HZ
}
