package localcluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// Redis is a real redis-server (Debian's package, installed by hack/deps.sh)
// run as a local process for tests and the demo: TLS only, a password, no
// persistence (a restart empties it, the worst case for its clients).
type Redis struct {
	cfg      RedisConfig
	port     int
	password string
	caPEM    []byte
	proc     *Process
	log      string
}

// RedisConfig configures StartRedis.
type RedisConfig struct {
	// Dir holds its certificates, password file and log. Required.
	Dir string
	// Bind are the addresses it listens on; its certificate names each of
	// them. Default: a private loopback address (ListenAddr) when Port is
	// 0, else 127.0.0.1.
	Bind []net.IP
	// Port to listen on; 0 picks one the kernel found free on Bind[0]
	// (required with Netns, whose ports this process cannot probe).
	Port int
	// Plaintext serves without TLS (for the tests of a plaintext opt-in).
	Plaintext bool
	// Netns, if set, is the network namespace (`ip netns`) it runs in; the
	// Bind addresses are that namespace's.
	Netns string
}

// StartRedis starts redis-server and waits until it answers.
func StartRedis(ctx context.Context, cfg RedisConfig) (*Redis, error) {
	if cfg.Dir == "" {
		return nil, errors.New("localcluster: RedisConfig.Dir is required")
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (Debian package redis-server; `make deps` installs it): %w", err)
	}
	if err := cfg.listen(); err != nil {
		return nil, err
	}
	pw := make([]byte, 24)
	if _, err := rand.Read(pw); err != nil {
		return nil, err
	}
	r := &Redis{cfg: cfg, port: cfg.Port, password: hex.EncodeToString(pw), log: filepath.Join(cfg.Dir, "redis.log")}
	if err := os.WriteFile(r.PasswordFile(), []byte(r.password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if !cfg.Plaintext {
		ca, err := newCA("relaymesh-localcluster redis CA")
		if err != nil {
			return nil, err
		}
		serving, err := issueServing(ca, "redis", []string{"localhost"}, cfg.Bind)
		if err != nil {
			return nil, err
		}
		if _, _, err := serving.write(cfg.Dir, "redis"); err != nil {
			return nil, err
		}
		r.caPEM = ca.certPEM
		if err := os.WriteFile(r.CAFile(), ca.certPEM, 0o600); err != nil {
			return nil, err
		}
	}
	if err := r.start(ctx, bin); err != nil {
		return nil, err
	}
	return r, nil
}

// listen fills in Bind and Port: a port picked on 127.0.0.1 can be taken
// by another test's connection before redis-server binds it, and nothing
// retries this start, so a picked port is on an address of its own.
func (cfg *RedisConfig) listen() error {
	if cfg.Port != 0 {
		if len(cfg.Bind) == 0 {
			cfg.Bind = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		return nil
	}
	if cfg.Netns != "" {
		return errors.New("localcluster: RedisConfig.Port is required with Netns")
	}
	var addr string
	var err error
	if len(cfg.Bind) == 0 {
		addr, err = ListenAddr()
	} else {
		ip, ok := netip.AddrFromSlice(cfg.Bind[0])
		if !ok {
			return fmt.Errorf("localcluster: RedisConfig.Bind[0] %v is not an IP address", cfg.Bind[0])
		}
		addr, err = ListenAddrOn(ip.Unmap())
	}
	if err != nil {
		return fmt.Errorf("localcluster: redis listen address: %w", err)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return err
	}
	if len(cfg.Bind) == 0 {
		cfg.Bind = []net.IP{ap.Addr().AsSlice()}
	}
	cfg.Port = int(ap.Port())
	return nil
}

func (r *Redis) args() []string {
	args := []string{"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", r.cfg.Dir,
		"--requirepass", r.password, "--loglevel", "notice", "--daemonize", "no"}
	bind := []string{"--bind"}
	for _, ip := range r.cfg.Bind {
		bind = append(bind, ip.String())
	}
	args = append(args, bind...)
	if r.cfg.Plaintext {
		return append(args, "--port", strconv.Itoa(r.port))
	}
	return append(args, "--port", "0", "--tls-port", strconv.Itoa(r.port),
		"--tls-cert-file", filepath.Join(r.cfg.Dir, "redis.crt"), "--tls-key-file", filepath.Join(r.cfg.Dir, "redis.key"),
		"--tls-ca-cert-file", r.CAFile(), "--tls-auth-clients", "no")
}

func (r *Redis) start(ctx context.Context, bin string) error {
	// The password is an argument of this test-only process (a real
	// deployment reads it from a mounted file); only this machine's root
	// can read another process's arguments.
	name, args := bin, r.args()
	if r.cfg.Netns != "" {
		// ip netns exec execs redis-server in place: the process is still
		// this one's child, killed with it.
		name, args = "ip", append([]string{"netns", "exec", r.cfg.Netns, bin}, args...)
	}
	p, err := StartProcess("redis-server", name, args, r.log, false)
	if err != nil {
		return err
	}
	r.proc = p
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if done, err := p.Exited(); done {
			return fmt.Errorf("redis-server exited at start (%v); log %s", err, r.log)
		}
		c, err := net.DialTimeout("tcp", r.Address(), 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	_ = p.Stop(time.Second)
	return fmt.Errorf("redis-server did not listen on %s within 15s; log %s", r.Address(), r.log)
}

// Address is host:port of its first bind address.
func (r *Redis) Address() string {
	return net.JoinHostPort(r.cfg.Bind[0].String(), strconv.Itoa(r.port))
}

// Password is its password (a test secret: never log it).
func (r *Redis) Password() string { return r.password }

// PasswordFile holds the password, one line.
func (r *Redis) PasswordFile() string { return filepath.Join(r.cfg.Dir, "redis-password") }

// CAFile is the PEM CA its certificate chains to (TLS mode).
func (r *Redis) CAFile() string { return filepath.Join(r.cfg.Dir, "redis-ca.crt") }

// TLS is a client configuration that trusts its certificate; nil in
// plaintext mode.
func (r *Redis) TLS() *tls.Config {
	if r.cfg.Plaintext {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.caPEM)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// Pid is the server's process id.
func (r *Redis) Pid() int { return r.proc.cmd.Process.Pid }

// Log is the path of its log.
func (r *Redis) Log() string { return r.log }

// Restart SIGKILLs the server and starts it again on the same address,
// empty (no persistence).
func (r *Redis) Restart(ctx context.Context) error {
	if err := r.Kill(); err != nil {
		return err
	}
	return r.Start(ctx)
}

// Kill SIGKILLs the server (Start brings it back).
func (r *Redis) Kill() error { return r.proc.Kill() }

// Start starts a killed server again on the same address, empty.
func (r *Redis) Start(ctx context.Context) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	return r.start(ctx, bin)
}

// Stop terminates it.
func (r *Redis) Stop() error { return r.proc.Stop(5 * time.Second) }
