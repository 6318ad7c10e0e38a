package main

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
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where the replicas keep full snapshots.
const (
	snapshotStoreAPIServer = "apiserver"
	snapshotStoreRedis     = "redis"
)

// snapshotKeySecret holds the key that authenticates the replicas' records
// in the snapshot store; the first replica creates it.
const snapshotKeySecret = "relay-snapshot-key-secret"

// snapshotStoreFlags configure the replicas' shared snapshot store.
type snapshotStoreFlags struct {
	kind                       string
	address, username          string
	passwordFile, caFile, name string
	allowPlaintext             bool
	// reader: a command that reads the store (registerRead), which never
	// creates the replicas' key.
	reader bool
}

func (f *snapshotStoreFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.kind, "snapshot-store", snapshotStoreAPIServer, "where discovered Workloads live: apiserver (Workload objects in the management cluster: up to about 200 clusters of 1,000 workloads) or redis (every cluster's full snapshot in Redis, shared by the replicas; Meshes and Destinations stay in the apiserver; see docs/design/2026-11-25-high-availability.md)")
	fs.StringVar(&f.address, "redis-address", "", "with --snapshot-store=redis: host:port of the Redis server")
	fs.StringVar(&f.username, "redis-username", "", "with --snapshot-store=redis: Redis ACL user (empty: the default user)")
	fs.StringVar(&f.passwordFile, "redis-password-file", "", "with --snapshot-store=redis: file holding the Redis password (required unless --redis-allow-plaintext)")
	fs.StringVar(&f.caFile, "redis-ca-file", "", "with --snapshot-store=redis: PEM of the CA(s) Redis's TLS certificate chains to (required unless --redis-allow-plaintext)")
	fs.StringVar(&f.name, "redis-server-name", "", "with --snapshot-store=redis: the name Redis's certificate must carry (default: the host of --redis-address)")
	fs.BoolVar(&f.allowPlaintext, "redis-allow-plaintext", false, "WEAKER: talk to Redis without TLS (and without a password if none is given): anyone on the path reads every snapshot")
}

// registerRead adds the flags with which a live view of the management
// cluster (policy audit, describe) reads the Workloads of an installation
// whose servers run with --snapshot-store=redis.
func (f *snapshotStoreFlags) registerRead(fs *pflag.FlagSet) {
	f.reader = true
	const with = "for an installation with --snapshot-store=redis: "
	fs.StringVar(&f.address, "redis-address", "", with+"host:port of its Redis, to read every cluster's Workloads from (records are verified with the replicas' key, read from Secret "+snapshotKeySecret+" of --namespace)")
	fs.StringVar(&f.username, "redis-username", "", with+"Redis ACL user (empty: the default user)")
	fs.StringVar(&f.passwordFile, "redis-password-file", "", with+"file holding the Redis password (required with --redis-address unless --redis-allow-plaintext)")
	fs.StringVar(&f.caFile, "redis-ca-file", "", with+"PEM of the CA(s) Redis's TLS certificate chains to (required with --redis-address unless --redis-allow-plaintext)")
	fs.StringVar(&f.name, "redis-server-name", "", with+"the name Redis's certificate must carry (default: the host of --redis-address)")
	fs.BoolVar(&f.allowPlaintext, "redis-allow-plaintext", false, "WEAKER: read Redis without TLS (and without a password if none is given): anyone on the path reads every snapshot")
}

// validate checks the flags of register, or of registerRead, where
// --redis-address alone selects Redis: no Redis flag without Redis, and
// with Redis TLS and a password unless plaintext is the named opt-in.
func (f snapshotStoreFlags) validate() []error {
	selector := "--snapshot-store=redis"
	if f.reader {
		selector, f.kind = "--redis-address", snapshotStoreAPIServer
		if f.address != "" {
			f.kind = snapshotStoreRedis
		}
	}
	var errs []error
	switch f.kind {
	case snapshotStoreAPIServer, "":
		for name, v := range map[string]string{"--redis-address": f.address, "--redis-username": f.username, "--redis-password-file": f.passwordFile, "--redis-ca-file": f.caFile, "--redis-server-name": f.name} {
			if v != "" {
				errs = append(errs, fmt.Errorf("%s needs %s", name, selector))
			}
		}
		if f.allowPlaintext {
			errs = append(errs, fmt.Errorf("--redis-allow-plaintext needs %s", selector))
		}
	case snapshotStoreRedis:
		if f.address == "" {
			errs = append(errs, errors.New("--snapshot-store=redis needs --redis-address"))
		}
		if !f.allowPlaintext {
			if f.caFile == "" {
				errs = append(errs, fmt.Errorf("%s needs --redis-ca-file (Redis with TLS) or, WEAKER, --redis-allow-plaintext", selector))
			}
			if f.passwordFile == "" {
				errs = append(errs, fmt.Errorf("%s needs --redis-password-file or, WEAKER, --redis-allow-plaintext", selector))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("--snapshot-store %q: use %s or %s", f.kind, snapshotStoreAPIServer, snapshotStoreRedis))
	}
	return errs
}

// config reads the password and CA files and the replicas' record key.
func (f snapshotStoreFlags) config(ctx context.Context, kube *kubeclient.Clients, namespace string, reg prometheus.Registerer, log *slog.Logger) (snapshots.Config, error) {
	cfg := snapshots.Config{Address: f.address, Username: f.username, AllowPlaintext: f.allowPlaintext, Logger: log, Registerer: reg}
	if f.passwordFile != "" {
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return cfg, fmt.Errorf("--redis-password-file: %w", err)
		}
		cfg.Password = strings.TrimRight(string(b), "\r\n")
		if cfg.Password == "" {
			return cfg, fmt.Errorf("--redis-password-file %s is empty", f.passwordFile)
		}
	}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return cfg, fmt.Errorf("--redis-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, fmt.Errorf("--redis-ca-file %s holds no PEM certificate", f.caFile)
		}
		cfg.TLS = &tls.Config{RootCAs: pool, ServerName: f.name, MinVersion: tls.VersionTLS12}
	} else if f.allowPlaintext {
		log.Warn("WEAKER: the snapshot store is reached without TLS (--redis-allow-plaintext)")
	}
	key, err := snapshotKey(ctx, kube, namespace, !f.reader)
	if err != nil {
		return cfg, err
	}
	cfg.Key = key
	return cfg, nil
}

// snapshotKey reads the key the replicas authenticate their records with;
// with create (a replica) it makes it if no replica did yet (replicas
// starting together race on the create; the apiserver lets one win and the
// others read its key). A reader (the CLI) never makes one.
func snapshotKey(ctx context.Context, kube *kubeclient.Clients, namespace string, create bool) ([]byte, error) {
	secrets := kube.Typed.CoreV1().Secrets(namespace)
	for range 3 {
		s, err := secrets.Get(ctx, snapshotKeySecret, metav1.GetOptions{})
		if err == nil {
			key := s.Data["key"]
			if len(key) < snapshots.MinKeyBytes {
				return nil, fmt.Errorf("secret %s/%s: key holds %d bytes, at least %d are required (delete the Secret to have a new key made; every replica must then restart)", namespace, snapshotKeySecret, len(key), snapshots.MinKeyBytes)
			}
			return key, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %s/%s: %w", namespace, snapshotKeySecret, err)
		}
		if !create {
			return nil, fmt.Errorf("secret %s/%s does not exist: the server replicas create it when they start with --snapshot-store=redis (is --namespace the servers' namespace?)", namespace, snapshotKeySecret)
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: snapshotKeySecret, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"key": key},
		}, metav1.CreateOptions{})
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create secret %s/%s: %w", namespace, snapshotKeySecret, err)
		}
	}
	return nil, fmt.Errorf("secret %s/%s: could not read or create it", namespace, snapshotKeySecret)
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

// startSharedSnapshots starts the shared snapshots when --snapshot-store is
// redis (nil otherwise). With several replicas each writes the snapshots of
// the sessions it holds.
func (f serverFlags) startSharedSnapshots(ctx context.Context, kube *kubeclient.Clients, view *server.View, ha bool, replica string,
	registered func(string) bool, reg prometheus.Registerer, log *slog.Logger) (*server.SharedSnapshots, error) {
	if f.store.kind != snapshotStoreRedis {
		return nil, nil
	}
	cfg, err := f.store.config(ctx, kube, f.namespace, reg, log)
	if err != nil {
		return nil, err
	}
	shared := server.SharedConfig{View: view, Namespace: f.namespace, Replica: replica, Registered: registered, Logger: log}
	if ha {
		shared.Owns = view.Has
	}
	return startSharedSnapshots(ctx, cfg, shared, log)
}

// collectSharedSnapshots deletes the stored snapshots of unregistered
// clusters while this replica leads: at once, when a cluster is
// deregistered, and every minute.
func collectSharedSnapshots(ctx context.Context, shared *server.SharedSnapshots, registry *server.Registry, log *slog.Logger) {
	revoked := make(chan struct{}, 1)
	registry.OnRevoke(func(string) {
		select {
		case revoked <- struct{}{}:
		default:
		}
	})
	for {
		if err := shared.Collect(ctx); err != nil && ctx.Err() == nil {
			log.Warn("could not delete the stored snapshots of unregistered clusters; retrying", "error", err)
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

// storeState is what this replica's Lease says of the snapshot store.
func storeState(s *server.SharedSnapshots) string {
	if ok, _ := s.Reachable(); ok {
		return leader.StoreReachable
	}
	return leader.StoreUnreachable
}

// storeDetect is how long a replica may take to notice it lost the
// snapshot store (a quiet subscription is pinged after half the store's
// 5 s timeout and given up after the other half), with a margin.
const storeDetect = 7 * time.Second

// othersReachStore returns when another live replica last said, on its
// Lease, that it reaches the snapshot store (zero: none does).
func othersReachStore(ctx context.Context, reps *replicas, namespace string) (time.Time, error) {
	all, err := leader.Replicas(ctx, reps.coord, namespace, time.Now())
	if err != nil {
		return time.Time{}, err
	}
	var last time.Time
	for name, r := range all {
		if name != reps.name && r.Alive && r.Store == leader.StoreReachable && r.Renewed.After(last) {
			last = r.Renewed
		}
	}
	return last, nil
}

// redisLog hands go-redis's messages to slog. They name addresses and
// commands, never the password.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}
