package localcluster

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestListenAddrIsAPrivateLoopbackAddress: every address is on a loopback
// address of its own, never 127.0.y.z, with a port a process can bind.
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
		assert.NotZero(t, b[1], "%s is not in 127.0.0.0/16", s)
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
