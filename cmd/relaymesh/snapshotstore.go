package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/spf13/pflag"
)

// Where the replicas keep full snapshots.
const (
	snapshotStoreAPIServer = app.StoreAPIServer
	snapshotStoreRedis     = app.StoreRedis
)

// snapshotKeySecret holds the key that authenticates the replicas' records
// in the snapshot store; the first replica creates it.
const snapshotKeySecret = app.SnapshotKeySecret

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
// --redis-address alone selects Redis (app.SnapshotStoreConfig.Check).
func (f snapshotStoreFlags) validate() []error {
	if f.reader {
		cfg := f.store()
		cfg.Kind = snapshotStoreAPIServer
		if f.address != "" {
			cfg.Kind = snapshotStoreRedis
		}
		return cfg.Check("--redis-address")
	}
	return f.store().Check("--snapshot-store=redis")
}

// store is the server's configuration of the snapshot store.
func (f snapshotStoreFlags) store() app.SnapshotStoreConfig {
	return app.SnapshotStoreConfig{Kind: f.kind, Address: f.address, Username: f.username, PasswordFile: f.passwordFile,
		CAFile: f.caFile, Name: f.name, AllowPlaintext: f.allowPlaintext}
}

// config reads the password and CA files and the replicas' record key (a
// reader never creates it).
func (f snapshotStoreFlags) config(ctx context.Context, kube *kubeclient.Clients, namespace string, reg prometheus.Registerer, log *slog.Logger) (snapshots.Config, error) {
	return f.store().Snapshots(ctx, kube.Typed, namespace, !f.reader, reg, log)
}

// snapshotKey reads (with create: makes if missing) the replicas' record
// key.
func snapshotKey(ctx context.Context, kube *kubeclient.Clients, namespace string, create bool) ([]byte, error) {
	return app.SnapshotKey(ctx, kube.Typed, namespace, create)
}
