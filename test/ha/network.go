package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The network of one harness is a private /24 that the harness itself makes
// and removes: 10.231.X.0/24, X chosen so no other run on the machine uses
// it. Nothing outside it (and 127.0.0.0/8, where the local clusters listen)
// is ever dialled, listened on or changed.
//
//	root namespace   bridge rmhb<tag>   10.231.X.1     agents, CLI, test clients
//	                                    10.231.X.100+  extra client source addresses
//	store namespace  rmha-<tag>-s       10.231.X.254   the management apiserver (a proxy)
//	redis namespace  rmha-<tag>-r       10.231.X.253   redis-server (AddRedis), when used
//	replica i        rmha-<tag>-<i>     10.231.X.10+i  `relaymesh server`
//
// <tag> is this process's pid (6 hex digits) and a sequence number, so
// parallel test processes never collide, and what a killed run left behind
// is recognised (its pid is gone) and removed by the next run.
const (
	subnetPrefix = "10.231."
	namePrefix   = "rmha-" // network namespaces
	bridgePrefix = "rmhb"  // bridges
	vethPrefix   = "rmhv"  // root ends of veth pairs
	peerPrefix   = "rmhp"  // namespace ends before they are renamed eth0
	// storeHost, redisHost, firstReplica and firstClient are last octets.
	storeHost    = 254
	redisHost    = 253
	firstReplica = 10
	firstClient  = 100
	// MaxReplicas is the most replicas one network holds.
	MaxReplicas = 16
	// MaxClientAddrs is how many extra client source addresses there are.
	MaxClientAddrs = 150
	// StorePort is the apiserver's port on the store address.
	StorePort = 6443
	// RedisPort is Redis's port on the redis address.
	RedisPort = 6379
)

// blackholeMAC is the link address a cut sends packets to: no interface on
// the bridge has it, so the bridge floods those frames to ports whose
// interfaces drop them. The packets vanish silently, as in a real partition
// (no reset, no ICMP error).
const blackholeMAC = "02:00:00:00:00:00"

var netSeq atomic.Uint32

// Network is the harness's private network: a bridge in the root network
// namespace, a store namespace that fronts the management apiserver, and one
// namespace per replica.
type Network struct {
	tag      string
	subnet   int // X of 10.231.X.0/24
	bridge   string
	store    string   // network namespace of the apiserver's front
	redis    string   // network namespace of redis-server, if added
	replicas []string // network namespaces of the replicas
	lock     *os.File // flock on the subnet, held while the network lives
	proxy    *proxy

	mu       sync.Mutex
	clients  int          // client addresses added so far
	cut      map[int]bool // replicas cut off from the store
	cutRedis map[int]bool // replicas cut off from Redis
}

// NewNetwork makes a network with a namespace for each of replicas and a
// store namespace whose StorePort forwards to apiserver (a loopback
// host:port). Everything it made is removed by Close, which t.Cleanup should
// call even when the test fails.
func NewNetwork(replicas int, apiserver string) (n *Network, err error) {
	if replicas < 1 || replicas > MaxReplicas {
		return nil, fmt.Errorf("ha network: %d replicas, want 1..%d", replicas, MaxReplicas)
	}
	if ap, err := netip.ParseAddrPort(apiserver); err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("ha network: apiserver %q must be a loopback host:port", apiserver)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("ha network: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("ha network: iproute2's ip is required: %w", err)
	}
	removeStale()
	n = &Network{tag: fmt.Sprintf("%06x%02x", os.Getpid()&0xffffff, netSeq.Add(1)&0xff), cut: map[int]bool{}, cutRedis: map[int]bool{}}
	if n.subnet, n.lock, err = claimSubnet(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = n.Close()
			n = nil
		}
	}()
	n.bridge = bridgePrefix + n.tag
	if err := ipCmd("link", "add", n.bridge, "type", "bridge"); err != nil {
		return n, err
	}
	if err := ipCmd("addr", "add", n.addr(1).String()+"/24", "dev", n.bridge); err != nil {
		return n, err
	}
	if err := ipCmd("link", "set", n.bridge, "up"); err != nil {
		return n, err
	}
	n.store = namePrefix + n.tag + "-s"
	if err := n.addNamespace(n.store, "s", n.addr(storeHost)); err != nil {
		return n, err
	}
	for i := range replicas {
		name := namePrefix + n.tag + "-" + strconv.Itoa(i)
		n.replicas = append(n.replicas, name)
		if err := n.addNamespace(name, strconv.FormatInt(int64(i), 16), n.ReplicaIP(i)); err != nil {
			return n, err
		}
	}
	n.proxy, err = startProxy(nsPath(n.store), netip.AddrPortFrom(n.addr(storeHost), StorePort).String(), apiserver)
	if err != nil {
		return n, err
	}
	// The bridge forwards as soon as its ports are up (no STP); wait until
	// every replica reaches the store, so a test starts on a working network.
	for i := range n.replicas {
		if err := n.waitReach(i, 10*time.Second); err != nil {
			return n, err
		}
	}
	return n, nil
}

// addNamespace makes a network namespace with a veth pair to the bridge and
// ip on its eth0.
func (n *Network) addNamespace(name, suffix string, ip netip.Addr) error {
	if err := ipCmd("netns", "add", name); err != nil {
		return err
	}
	veth, peer := vethPrefix+n.tag+suffix, peerPrefix+n.tag+suffix
	steps := [][]string{
		{"link", "add", veth, "type", "veth", "peer", "name", peer, "netns", name},
		{"-n", name, "link", "set", peer, "name", "eth0"},
		{"-n", name, "addr", "add", ip.String() + "/24", "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "link", "set", "lo", "up"},
		{"link", "set", veth, "master", n.bridge},
		{"link", "set", veth, "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	return nil
}

// waitReach waits until replica i's namespace can open a connection to the
// store.
func (n *Network) waitReach(i int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := n.Probe(i, n.StoreAddr(), 500*time.Millisecond)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ha network: replica %d cannot reach the store: %w", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close removes every namespace, link and address the network made and
// releases its subnet. It is safe to call twice.
func (n *Network) Close() error {
	var errs []error
	if n.proxy != nil {
		n.proxy.Close()
		n.proxy = nil
	}
	// Deleting a namespace deletes the veth pairs with an end in it.
	for _, ns := range append(append([]string(nil), n.replicas...), n.store, n.redis) {
		if ns != "" && nsExists(ns) {
			if err := ipCmd("netns", "del", ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	n.replicas, n.store, n.redis = nil, "", ""
	if n.bridge != "" && linkExists(n.bridge) {
		if err := ipCmd("link", "del", n.bridge); err != nil {
			errs = append(errs, err)
		}
	}
	n.bridge = ""
	if n.lock != nil {
		_ = n.lock.Close() // releases the flock
		n.lock = nil
	}
	return errors.Join(errs...)
}

// addr is 10.231.X.host.
func (n *Network) addr(host int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 231, byte(n.subnet), byte(host)})
}

// Subnet is the network's 10.231.X.0/24.
func (n *Network) Subnet() netip.Prefix { return netip.PrefixFrom(n.addr(0), 24) }

// ReplicaIP is replica i's address.
func (n *Network) ReplicaIP(i int) netip.Addr { return n.addr(firstReplica + i) }

// StoreAddr is where replicas reach the management apiserver.
func (n *Network) StoreAddr() netip.AddrPort { return netip.AddrPortFrom(n.addr(storeHost), StorePort) }

// Namespace is the network namespace of replica i (for `ip netns exec`).
func (n *Network) Namespace(i int) string { return n.replicas[i] }

// Replicas is how many replica namespaces the network has.
func (n *Network) Replicas() int { return len(n.replicas) }

// ClientAddr adds and returns a fresh source address in the root namespace,
// for a client that must look like a different peer to the replicas (their
// failure budgets are per source address). At most MaxClientAddrs.
func (n *Network) ClientAddr() (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.clients >= MaxClientAddrs {
		return netip.Addr{}, fmt.Errorf("ha network: all %d client addresses are in use", MaxClientAddrs)
	}
	a := n.addr(firstClient + n.clients)
	if err := ipCmd("addr", "add", a.String()+"/32", "dev", n.bridge); err != nil {
		return netip.Addr{}, err
	}
	n.clients++
	return a, nil
}

// CutAPIServer cuts replica i off from the management apiserver: packets
// between its namespace and the store are dropped silently in both
// directions, as in a network partition; connections already open hang, new
// ones time out. Agents and clients still reach the replica.
func (n *Network) CutAPIServer(i int) error {
	if err := n.cutOff(i, n.store, n.addr(storeHost)); err != nil {
		return err
	}
	n.mu.Lock()
	n.cut[i] = true
	n.mu.Unlock()
	return nil
}

// RestoreAPIServer undoes CutAPIServer: both sides resolve each other again
// and open connections resume (TCP retransmits what was lost).
func (n *Network) RestoreAPIServer(i int) error {
	if err := n.restore(i, n.store, n.addr(storeHost)); err != nil {
		return err
	}
	n.mu.Lock()
	delete(n.cut, i)
	n.mu.Unlock()
	return nil
}

// AddRedis makes the namespace redis-server runs in (RedisNamespace) at
// RedisAddr.
func (n *Network) AddRedis() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.redis != "" {
		return nil
	}
	name := namePrefix + n.tag + "-r"
	if err := n.addNamespace(name, "r", n.addr(redisHost)); err != nil {
		return err
	}
	n.redis = name
	return nil
}

// RedisNamespace is the network namespace of redis-server (after AddRedis).
func (n *Network) RedisNamespace() string { return n.redis }

// RedisAddr is where replicas reach Redis.
func (n *Network) RedisAddr() netip.AddrPort { return netip.AddrPortFrom(n.addr(redisHost), RedisPort) }

// CutRedis cuts replica i off from Redis (and only from it), as CutAPIServer
// does from the apiserver.
func (n *Network) CutRedis(i int) error {
	if n.redis == "" {
		return errors.New("ha network: no redis namespace (AddRedis)")
	}
	if err := n.cutOff(i, n.redis, n.addr(redisHost)); err != nil {
		return err
	}
	n.mu.Lock()
	n.cutRedis[i] = true
	n.mu.Unlock()
	return nil
}

// RestoreRedis undoes CutRedis.
func (n *Network) RestoreRedis(i int) error {
	if err := n.restore(i, n.redis, n.addr(redisHost)); err != nil {
		return err
	}
	n.mu.Lock()
	delete(n.cutRedis, i)
	n.mu.Unlock()
	return nil
}

// cutOff drops the packets between replica i and the host at ip in the
// namespace ns: a permanent neighbour entry to a link address nobody has,
// on each side. Every other address keeps its real entry.
func (n *Network) cutOff(i int, ns string, ip netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= len(n.replicas) {
		return fmt.Errorf("ha network: no replica %d", i)
	}
	if err := ipCmd("-n", n.replicas[i], "neigh", "replace", ip.String(), "lladdr", blackholeMAC, "dev", "eth0", "nud", "permanent"); err != nil {
		return err
	}
	return ipCmd("-n", ns, "neigh", "replace", n.ReplicaIP(i).String(), "lladdr", blackholeMAC, "dev", "eth0", "nud", "permanent")
}

// restore undoes cutOff.
func (n *Network) restore(i int, ns string, ip netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= len(n.replicas) {
		return fmt.Errorf("ha network: no replica %d", i)
	}
	var errs []error
	for _, s := range [][]string{
		{"-n", n.replicas[i], "neigh", "del", ip.String(), "dev", "eth0"},
		{"-n", ns, "neigh", "del", n.ReplicaIP(i).String(), "dev", "eth0"},
	} {
		if err := ipCmd(s...); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// IsCut reports whether replica i is cut off from the apiserver.
func (n *Network) IsCut(i int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[i]
}

// Probe opens (and closes) a TCP connection from replica i's namespace to
// addr, which must be in the network's subnet.
func (n *Network) Probe(i int, addr netip.AddrPort, timeout time.Duration) error {
	if !n.Subnet().Contains(addr.Addr()) {
		return fmt.Errorf("ha network: %s is not in %s", addr, n.Subnet())
	}
	if i < 0 || i >= len(n.replicas) {
		return fmt.Errorf("ha network: no replica %d", i)
	}
	return inNetns(nsPath(n.replicas[i]), func() error {
		c, err := net.DialTimeout("tcp", addr.String(), timeout)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// nsPath is where `ip netns` keeps a namespace.
func nsPath(name string) string { return filepath.Join("/run/netns", name) }

// inNetns runs f on an OS thread that has joined the network namespace at
// path. Sockets f creates belong to that namespace for their whole life.
// The thread then returns to the namespace it came from before it is
// unlocked. It must not simply end: a child process started with Pdeathsig
// (every process test/localcluster starts) dies with the thread that forked
// it, and that may be this one (golang.org/issue/27505). Only if returning
// fails is the thread left locked, so the runtime discards it rather than
// run other goroutines in the wrong namespace.
func inNetns(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open %s: %w", path, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		ferr := f()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return from %s: %w", path, err))
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// ipCmd runs iproute2's ip.
func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func nsExists(name string) bool {
	_, err := os.Stat(nsPath(name))
	return err == nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// claimSubnet picks X for 10.231.X.0/24: a flock on a file per subnet keeps
// two live runs apart (the kernel drops it when its process dies), and a
// subnet any interface of the root namespace already has an address in is
// skipped, whoever made it.
func claimSubnet() (int, *os.File, error) {
	dir := filepath.Join(os.TempDir(), "relaymesh-ha-subnets")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, err
	}
	used, err := usedSubnets()
	if err != nil {
		return 0, nil, err
	}
	start := os.Getpid() % 250
	for k := range 250 {
		x := 1 + (start+k)%250
		if used[x] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("10.231.%d.lock", x)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		// Checked again under the lock: a run that held it may have just
		// made its bridge.
		if used, err = usedSubnets(); err != nil || used[x] {
			f.Close()
			if err != nil {
				return 0, nil, err
			}
			continue
		}
		return x, f, nil
	}
	return 0, nil, errors.New("ha network: every 10.231.X.0/24 is in use")
}

// usedSubnets are the X of 10.231.X.0/24 that an address of the root
// namespace lies in.
func usedSubnets() (map[int]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	used := map[int]bool{}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() {
			continue
		}
		b := p.Addr().As4()
		if b[0] == 10 && b[1] == 231 {
			used[int(b[2])] = true
		}
	}
	return used, nil
}

// removeStale deletes the namespaces and links that a harness run whose
// process is gone left behind (a test binary killed by a timeout runs no
// cleanup). Only names of this harness's shape, and only of dead pids.
func removeStale() {
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if tag, ok := strings.CutPrefix(e.Name(), namePrefix); ok && staleTag(tag) {
				_ = ipCmd("netns", "del", e.Name())
			}
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return
	}
	for _, ifc := range ifaces {
		for _, prefix := range []string{bridgePrefix, vethPrefix} {
			if tag, ok := strings.CutPrefix(ifc.Name, prefix); ok && staleTag(tag) {
				_ = ipCmd("link", "del", ifc.Name)
			}
		}
	}
}

// staleTag reports whether a name's tag starts with the pid of a process
// that no longer exists.
func staleTag(tag string) bool {
	if len(tag) < 6 {
		return false
	}
	pid, err := strconv.ParseInt(tag[:6], 16, 32)
	if err != nil || pid <= 1 || int(pid) == os.Getpid() {
		return false
	}
	err = syscall.Kill(int(pid), 0)
	return errors.Is(err, syscall.ESRCH)
}
