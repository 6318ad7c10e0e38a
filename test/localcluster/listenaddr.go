package localcluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
)

// PrivateLoopback is a loopback address of the caller's own: 127.x.y.z
// with x from 220 to 254 and y, z random, z neither 0 nor 255. Below 220
// are the addresses other harnesses connect from and bind by design:
// 127.0.0.1, where the machine's loopback listeners are and connections
// to loopback leave from, 127.0.y.z (tests of per-address limits),
// test/fleet's agents (127.64.0.0/10) and test/dataplane's workloads
// (127.20.0.0 to 127.219.255.255). Two picks are the same address about
// once in two million.
func PrivateLoopback() netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(privateLoopbackFirst + rand.IntN(255-privateLoopbackFirst)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

// privateLoopbackFirst is the lowest second octet PrivateLoopback picks.
const privateLoopbackFirst = 220

// ListenAddr is host:port for a process a test starts to listen on,
// which no other process takes before it binds: a port the kernel found
// free on a private loopback address (PrivateLoopback). Nothing else
// listens there, and connections to loopback leave from 127.0.0.1, so
// unlike a port of 127.0.0.1 (FreePort) it is not lost to another test's
// outgoing connection between the pick and the bind. A server whose
// certificate names its IP (relaymesh server --server-ips) must name this
// one. On a system whose loopback interface has only 127.0.0.1 it is a
// port of 127.0.0.1.
func ListenAddr() (string, error) {
	addr, err := ListenAddrOn(PrivateLoopback())
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		return ListenAddrOn(netip.AddrFrom4([4]byte{127, 0, 0, 1}))
	}
	return addr, err
}

// ListenAddrOn is host:port with a port the kernel found free on ip
// (bound, then released).
func ListenAddrOn(ip netip.Addr) (string, error) {
	l, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return "", err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("unexpected listener address %v", l.Addr())
	}
	return netip.AddrPortFrom(ip, uint16(addr.Port)).String(), nil
}

// serveAddr is the address an environment's etcd and API servers listen
// on: ListenAddr's (a private loopback address, or 127.0.0.1 where no
// other can be bound), so that the ports picked for them are not lost to
// another process's outgoing connection, which leaves from 127.0.0.1 —
// neither between the pick and the bind nor while Restart has them down
// (their clients hold the URL, so the port cannot move).
func serveAddr() (netip.Addr, error) {
	addr, err := ListenAddr()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("localcluster: a loopback address for etcd and the API servers: %w", err)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr(), nil
}
