package localcluster

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestListenAddrIsAPrivateLoopbackAddress: every address is on a loopback
// address of its own, 127.220.0.0 or above (never where other harnesses
// connect from), with a port a process can bind.
func TestListenAddrIsAPrivateLoopbackAddress(t *testing.T) {
	ips := map[netip.Addr]bool{}
	for range 32 {
		s, err := ListenAddr()
		require.NoError(t, err)
		ap, err := netip.ParseAddrPort(s)
		require.NoError(t, err)
		ip := ap.Addr()
		require.True(t, ip.Is4() && ip.IsLoopback(), "%s", s)
		b := ip.As4()
		assert.GreaterOrEqual(t, b[1], byte(privateLoopbackFirst), "%s is not among the fleet's, the data plane's or 127.0.y.z source addresses", s)
		assert.NotContains(t, []byte{0, 255}, b[3], "%s", s)
		assert.NotZero(t, ap.Port())
		ips[ip] = true
		l, err := net.Listen("tcp", s)
		require.NoError(t, err, "the address can be bound")
		require.NoError(t, l.Close())
	}
	assert.Greater(t, len(ips), 30, "the addresses are random")
}

// TestListenAddrIsNotLostToTheDefaultLoopback: a socket that takes the
// same port on 127.0.0.1 — another test's listener, or an outgoing
// connection to loopback, which leaves from 127.0.0.1 — does not keep a
// process from binding the address (a FreePort port, on 127.0.0.1, is
// lost that way: "bind: address already in use").
func TestListenAddrIsNotLostToTheDefaultLoopback(t *testing.T) {
	taken := 0
	for range 20 {
		s, err := ListenAddr()
		require.NoError(t, err)
		ap := netip.MustParseAddrPort(s)
		other, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port()).String())
		if err != nil {
			continue // that port of 127.0.0.1 is in use already: try another
		}
		l, err := net.Listen("tcp", s)
		require.NoError(t, err, "%s is free while 127.0.0.1:%d is taken", s, ap.Port())
		require.NoError(t, l.Close())
		require.NoError(t, other.Close())
		taken++
	}
	require.Positive(t, taken, "at least one port was taken on 127.0.0.1 first")
}

// TestListenAddrOnReportsTheKernelsPort: the port is one the kernel chose
// on that address, and an address nothing can bind is an error.
func TestListenAddrOnReportsTheKernelsPort(t *testing.T) {
	s, err := ListenAddrOn(netip.MustParseAddr("127.0.0.1"))
	require.NoError(t, err)
	ap := netip.MustParseAddrPort(s)
	assert.Equal(t, "127.0.0.1", ap.Addr().String())
	assert.NotZero(t, ap.Port())
	_, err = ListenAddrOn(netip.MustParseAddr("192.0.2.1")) // TEST-NET-1: on no interface
	assert.Error(t, err)
}

// TestListenAddrIsDistinctAcrossConcurrentCallers: addresses picked at the
// same time (by parallel tests, or by test binaries of other packages,
// which pick the same way) are all different and can all be bound at once:
// no two processes are handed one address.
func TestListenAddrIsDistinctAcrossConcurrentCallers(t *testing.T) {
	const callers, picks = 8, 16
	var mu sync.Mutex
	seen := map[string]bool{}
	var listeners []net.Listener
	t.Cleanup(func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, callers*picks)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range picks {
				s, err := ListenAddr()
				if err != nil {
					errs <- err
					return
				}
				l, err := net.Listen("tcp", s)
				if err != nil {
					errs <- fmt.Errorf("bind %s while the other picks are held: %w", s, err)
					return
				}
				mu.Lock()
				if seen[s] {
					errs <- fmt.Errorf("%s was handed out twice", s)
				}
				seen[s] = true
				listeners = append(listeners, l)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Len(t, seen, callers*picks)
}

// TestStartRedisListensOnAPrivateLoopbackAddress: a redis-server started
// without an address gets one of its own (nothing retries its start, so a
// port of 127.0.0.1 could be lost), its certificate names it, and a
// netns'd one without a port is refused before anything starts.
func TestStartRedisListensOnAPrivateLoopbackAddress(t *testing.T) {
	SkipIfShort(t) // starts redis-server
	r, err := StartRedis(t.Context(), RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Stop() })
	ap, err := netip.ParseAddrPort(r.Address())
	require.NoError(t, err)
	assert.True(t, ap.Addr().IsLoopback(), "%s", r.Address())
	assert.NotEqual(t, "127.0.0.1", ap.Addr().String(), "the first choice is a private loopback address")
	conn, err := tls.Dial("tcp", r.Address(), r.TLS())
	require.NoError(t, err, "its certificate names %s", ap.Addr())
	require.NoError(t, conn.Close())

	_, err = StartRedis(t.Context(), RedisConfig{Dir: t.TempDir(), Netns: "nowhere"})
	assert.ErrorContains(t, err, "Port is required with Netns")
}
