package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/server/snapshots"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Where the replicas keep full snapshots (SnapshotStoreConfig.Kind).
const (
	StoreAPIServer = "apiserver"
	StoreRedis     = "redis"
)

// SnapshotKeySecret holds the key that authenticates the replicas' records
// in the snapshot store; the first replica creates it.
const SnapshotKeySecret = "relay-snapshot-key-secret"

// SnapshotStoreConfig configures the replicas' shared snapshot store
// (--snapshot-store and the --redis-… flags).
type SnapshotStoreConfig struct {
	// Kind is StoreAPIServer (or empty) or StoreRedis.
	Kind                       string
	Address, Username          string
	PasswordFile, CAFile, Name string
	// AllowPlaintext (WEAKER, --redis-allow-plaintext) talks to Redis
	// without TLS.
	AllowPlaintext bool
}

// Check reports every problem of s; selector is the flag that selects
// Redis (--snapshot-store=redis for the server, --redis-address for a
// reading CLI command). No Redis flag without Redis, and with Redis TLS
// and a password unless plaintext is the named opt-in.
func (s SnapshotStoreConfig) Check(selector string) []error {
	var errs []error
	switch s.Kind {
	case StoreAPIServer, "":
		for _, f := range []struct{ flag, v string }{{"--redis-address", s.Address}, {"--redis-username", s.Username},
			{"--redis-password-file", s.PasswordFile}, {"--redis-ca-file", s.CAFile}, {"--redis-server-name", s.Name}} {
			if f.v != "" {
				errs = append(errs, fmt.Errorf("%s needs %s", f.flag, selector))
			}
		}
		if s.AllowPlaintext {
			errs = append(errs, fmt.Errorf("--redis-allow-plaintext needs %s", selector))
		}
	case StoreRedis:
		if s.Address == "" {
			errs = append(errs, errors.New("--snapshot-store=redis needs --redis-address"))
		}
		if !s.AllowPlaintext {
			if s.CAFile == "" {
				errs = append(errs, fmt.Errorf("%s needs --redis-ca-file (Redis with TLS) or, WEAKER, --redis-allow-plaintext", selector))
			}
			if s.PasswordFile == "" {
				errs = append(errs, fmt.Errorf("%s needs --redis-password-file or, WEAKER, --redis-allow-plaintext", selector))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("--snapshot-store %q: use %s or %s", s.Kind, StoreAPIServer, StoreRedis))
	}
	return errs
}

// Snapshots reads the password and CA files and the replicas' record key
// (SnapshotKey; create: a replica, which makes the key if none exists).
func (s SnapshotStoreConfig) Snapshots(ctx context.Context, kube kubernetes.Interface, namespace string, create bool, reg prometheus.Registerer, log *slog.Logger) (snapshots.Config, error) {
	cfg := snapshots.Config{Address: s.Address, Username: s.Username, AllowPlaintext: s.AllowPlaintext, Logger: log, Registerer: reg}
	if s.PasswordFile != "" {
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return cfg, fmt.Errorf("--redis-password-file: %w", err)
		}
		cfg.Password = strings.TrimRight(string(b), "\r\n")
		if cfg.Password == "" {
			return cfg, fmt.Errorf("--redis-password-file %s is empty", s.PasswordFile)
		}
	}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return cfg, fmt.Errorf("--redis-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, fmt.Errorf("--redis-ca-file %s holds no PEM certificate", s.CAFile)
		}
		cfg.TLS = &tls.Config{RootCAs: pool, ServerName: s.Name, MinVersion: tls.VersionTLS12}
	} else if s.AllowPlaintext {
		log.Warn("WEAKER: the snapshot store is reached without TLS (--redis-allow-plaintext)")
	}
	key, err := SnapshotKey(ctx, kube, namespace, create)
	if err != nil {
		return cfg, err
	}
	cfg.Key = key
	return cfg, nil
}

// SnapshotKey reads the key the replicas authenticate their records with;
// with create (a replica) it makes it if no replica did yet (replicas
// starting together race on the create; the apiserver lets one win and the
// others read its key). A reader (the CLI) never makes one.
func SnapshotKey(ctx context.Context, kube kubernetes.Interface, namespace string, create bool) ([]byte, error) {
	secrets := kube.CoreV1().Secrets(namespace)
	for range 3 {
		s, err := secrets.Get(ctx, SnapshotKeySecret, metav1.GetOptions{})
		if err == nil {
			key := s.Data["key"]
			if len(key) < snapshots.MinKeyBytes {
				return nil, fmt.Errorf("secret %s/%s: key holds %d bytes, at least %d are required (delete the Secret to have a new key made; every replica must then restart)", namespace, SnapshotKeySecret, len(key), snapshots.MinKeyBytes)
			}
			return key, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %s/%s: %w", namespace, SnapshotKeySecret, err)
		}
		if !create {
			return nil, fmt.Errorf("secret %s/%s does not exist: the server replicas create it when they start with --snapshot-store=redis (is --namespace the servers' namespace?)", namespace, SnapshotKeySecret)
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: SnapshotKeySecret, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"key": key},
		}, metav1.CreateOptions{})
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create secret %s/%s: %w", namespace, SnapshotKeySecret, err)
		}
	}
	return nil, fmt.Errorf("secret %s/%s: could not read or create it", namespace, SnapshotKeySecret)
}

// newSharedSnapshots starts the shared snapshots when the store is Redis
// (nil otherwise). With several replicas each writes the snapshots of the
// sessions it holds.
func (p *process) newSharedSnapshots(ctx context.Context) error {
	if p.cfg.SnapshotStore.Kind != StoreRedis {
		return nil
	}
	cfg, err := p.cfg.SnapshotStore.Snapshots(ctx, p.kube.Typed, p.cfg.Namespace, true, p.reg, p.log)
	if err != nil {
		return err
	}
	shared := server.SharedConfig{View: p.view, Namespace: p.cfg.Namespace, Replica: p.reps.name, Registered: p.registered, Logger: p.log}
	if p.reps.several {
		shared.Owns = p.view.Has
	}
	p.sharedSnaps, err = startSharedSnapshots(ctx, cfg, shared, p.log)
	return err
}

// startSharedSnapshots connects to the snapshot store and reads it whole
// before translation starts: translating without the Workloads would
// publish access policies without their sources.
func startSharedSnapshots(ctx context.Context, cfg snapshots.Config, shared server.SharedConfig, log *slog.Logger) (*server.SharedSnapshots, error) {
	// go-redis's own messages (reconnects, pool dials) go to the server's
	// structured log at debug level; the store reports failures itself.
	redis.SetLogger(redisLog{log.With("component", "redis-client")})
	store, err := snapshots.New(cfg)
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := store.Ping(pingCtx); err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	shared.Store = store
	s, err := server.NewSharedSnapshots(shared)
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	go func() {
		s.Run(ctx)
		_ = store.Close()
	}()
	syncCtx, cancelSync := context.WithTimeout(ctx, time.Minute)
	defer cancelSync()
	if err := s.WaitSynced(syncCtx); err != nil {
		return nil, err
	}
	log.Info("snapshot store read: Workloads come from it", "address", cfg.Address, "tls", cfg.TLS != nil)
	return s, nil
}

// collectSharedSnapshots deletes the stored snapshots of unregistered
// clusters while this replica leads: at once, when a cluster is
// deregistered, and every minute (the once-only task
// snapshot-store-collection).
func (p *process) collectSharedSnapshots(ctx context.Context) {
	revoked := make(chan struct{}, 1)
	p.registry.OnRevoke(func(string) {
		select {
		case revoked <- struct{}{}:
		default:
		}
	})
	for {
		if err := p.sharedSnaps.Collect(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("could not delete the stored snapshots of unregistered clusters; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-revoked:
		case <-time.After(time.Minute):
		}
	}
}

// storeCutGrace is how long a replica may not reach the snapshot store
// before it checks whether the others do (and, if so, counts itself cut
// off).
const storeCutGrace = 4 * time.Second

// storeDetect is how long a replica may take to notice it lost the
// snapshot store (a quiet subscription is pinged after half the store's
// 5 s timeout and given up after the other half), with a margin.
const storeDetect = 7 * time.Second

// storeState is what this replica's Lease says of the snapshot store.
func storeState(s *server.SharedSnapshots) string {
	if ok, _ := s.Reachable(); ok {
		return leader.StoreReachable
	}
	return leader.StoreUnreachable
}

// othersReachStore returns when another live replica last said, on its
// Lease, that it reaches the snapshot store (zero: none does).
func (p *process) othersReachStore(ctx context.Context) (time.Time, error) {
	all, err := leader.Replicas(ctx, p.reps.leases, p.cfg.Namespace, time.Now())
	if err != nil {
		return time.Time{}, err
	}
	return lastOtherReaching(all, p.reps.name), nil
}

// lastOtherReaching is when a live replica other than self last said it
// reaches the snapshot store (zero: none does).
func lastOtherReaching(all map[string]leader.Replica, self string) time.Time {
	var last time.Time
	for name, r := range all {
		if name != self && r.Alive && r.Store == leader.StoreReachable && r.Renewed.After(last) {
			last = r.Renewed
		}
	}
	return last
}

// redisLog hands go-redis's messages to slog. They name addresses and
// commands, never the password.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}
