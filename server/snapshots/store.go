// Package snapshots keeps the latest accepted discovery snapshot of every
// cluster in Redis, shared by the management server's replicas: the replica
// holding a cluster's session writes it, every replica reads every
// cluster's. It is the store the high-availability design chose for full
// snapshots at fleet size (docs/design/2026-11-25-high-availability.md):
// 1,000 clusters of 1,000 Workloads would need more than etcd's default
// quota as discovered objects in the apiserver.
//
// The store is trusted for availability, not for content. Every record is
// authenticated with a key only the replicas hold (HMAC-SHA256 over the
// record's sequence, the cluster's name and the snapshot's bytes): a store
// that is compromised, or anyone else who can write to it, can withhold or
// delete records, but cannot forge a workload, change one, or move a
// record to another cluster; and a replica refuses a record older than
// one of its cluster it has seen (a replay). A record that does not verify
// is refused, logged and counted, and the last good one stays.
// Announcements are not authenticated, and carry nothing a replica acts on
// without reading and verifying the record or confirming its absence (see
// announcement). What remains open to someone with write access to the
// store: a replica that restarted has seen nothing yet, and takes the
// newest record it finds, replayed or not, until the replica holding the
// cluster's session writes it again (docs/design/2026-12-01-snapshot-
// record-sequence.md).
//
// The connection is TLS with a password by default; plaintext is a named
// opt-in (Config.AllowPlaintext).
//
// Layout, under Config.Prefix (default "relaymesh:"):
//
//	snapshot:<cluster>  hash: rec = the record (record.go), at = when Redis
//	                    stored it (its own clock, microseconds), hash = the
//	                    snapshot's hash; at and hash are not authenticated
//	snapshots           channel: "put <at> <hash> <cluster>" after every
//	                    write, "del <cluster>" after a delete
package snapshots

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/relay"
)

// Config configures a Store.
type Config struct {
	// Address is the Redis server's host:port. Required.
	Address string
	// Username (Redis ACL; empty: the default user) and Password. The
	// password is a secret: it is never logged nor put in an error.
	Username string
	Password string
	// TLS configures the connection; nil is refused unless AllowPlaintext.
	TLS *tls.Config
	// AllowPlaintext permits a connection without TLS (and, with an empty
	// Password, without one): anyone on the path can then read every
	// snapshot and the password. A named, logged opt-in.
	AllowPlaintext bool
	// Key authenticates every record; at least MinKeyBytes bytes, the same
	// on every replica. Required.
	Key []byte
	// Prefix of every key and channel; default "relaymesh:".
	Prefix string
	// Limits are the snapshot limits of the relay; a record over them is
	// refused (default relay.SnapshotLimits{}.WithDefaults()).
	Limits relay.SnapshotLimits
	// Timeout of one command (default 5s); a dial gets half of it, and a
	// quiet subscription is pinged after half of it.
	Timeout time.Duration
	// Now is the clock whose nanoseconds the sequences of the records this
	// replica writes start from (default time.Now); see Put.
	Now func() time.Time
	// Logger (default: discard) and Registerer (optional) for
	// relaymesh_snapshot_store_requests_total and
	// relaymesh_snapshot_store_subscribed.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Validate reports every error of c, with its field.
func (c Config) Validate() error {
	var errs []error
	if c.Address == "" {
		errs = append(errs, errors.New("snapshots.Address: required (host:port of the Redis server)"))
	}
	if c.TLS == nil && !c.AllowPlaintext {
		errs = append(errs, errors.New("snapshots.TLS: required; a connection without TLS needs AllowPlaintext"))
	}
	if c.Password == "" && !c.AllowPlaintext {
		errs = append(errs, errors.New("snapshots.Password: required; a connection without a password needs AllowPlaintext"))
	}
	if len(c.Key) < MinKeyBytes {
		errs = append(errs, fmt.Errorf("snapshots.Key: %d bytes, at least %d required", len(c.Key), MinKeyBytes))
	}
	if strings.ContainsAny(c.Prefix, " \r\n") {
		errs = append(errs, errors.New("snapshots.Prefix: no spaces or line breaks"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "relaymesh:"
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Limits = c.Limits.WithDefaults()
	return c
}

// maxRecordBytes bounds a record: the largest snapshot the relay accepts
// plus the record's own header.
func (c Config) maxRecordBytes() int { return c.Limits.MaxChunkedBytes + 1<<16 }

// Store is the Redis store of snapshots. Its methods are safe for
// concurrent use.
type Store struct {
	cfg        Config
	rdb        *redis.Client
	log        *slog.Logger
	requests   *prometheus.CounterVec
	subscribed prometheus.Gauge

	mu sync.Mutex
	// newest is, per cluster, the greatest sequence this Store has read
	// (and verified) or written: an older record is a replay.
	newest map[string]uint64
}

// New returns a store for cfg; it connects lazily (Ping to check now).
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Store{cfg: cfg, log: cfg.Logger.With("component", "snapshot-store"), newest: map[string]uint64{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRequests,
			Help: "Requests of the replicas' snapshot store (Redis), by operation (put, get, delete, list, watch) and result (ok, error, refused, replayed)."}, []string{"operation", "result"}),
		subscribed: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricSubscribed,
			Help: "1 while this replica is subscribed to the snapshot store's changes, else 0 (it then serves the last snapshots it read)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.requests, s.subscribed} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if cfg.TLS == nil {
		s.log.Warn("the snapshot store connection is not encrypted (AllowPlaintext): anyone on the path can read every snapshot", "address", cfg.Address)
	}
	var tlsCfg *tls.Config
	if cfg.TLS != nil {
		tlsCfg = cfg.TLS.Clone()
		if tlsCfg.MinVersion < tls.VersionTLS12 {
			tlsCfg.MinVersion = tls.VersionTLS12
		}
	}
	s.rdb = redis.NewClient(&redis.Options{
		Addr: cfg.Address, Username: cfg.Username, Password: cfg.Password, TLSConfig: tlsCfg,
		Protocol: 2, DisableIdentity: true,
		DialTimeout: cfg.Timeout / 2, ReadTimeout: cfg.Timeout, WriteTimeout: cfg.Timeout,
		MaxRetries: 1, PoolSize: 16, ContextTimeoutEnabled: true,
	})
	return s, nil
}

// Metric names.
const (
	MetricRequests   = "relaymesh_snapshot_store_requests_total"
	MetricSubscribed = "relaymesh_snapshot_store_subscribed"
)

// Close closes the connections.
func (s *Store) Close() error { return s.rdb.Close() }

// Ping checks that the store answers and accepts the credentials.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	return s.wrap(s.rdb.Ping(ctx).Err())
}

func (s *Store) key(cluster string) string { return s.cfg.Prefix + "snapshot:" + cluster }
func (s *Store) channel() string           { return s.cfg.Prefix + "snapshots" }

// putScript stores a record and announces it, atomically; "at" is Redis's
// own clock.
// The record's snapshot hash is stored and announced beside it, so a
// replica that holds that content already need not read the record again
// (after Redis restarted empty, every replica rewrites what it holds). The
// hash is not authenticated: a forged one can only make a replica keep the
// record it has.
var putScript = redis.NewScript(`
local t = redis.call('TIME')
local at = t[1] .. string.format('%06d', tonumber(t[2]))
redis.call('HSET', KEYS[1], 'rec', ARGV[1], 'at', at, 'hash', ARGV[3])
redis.call('PUBLISH', KEYS[2], 'put ' .. at .. ' ' .. ARGV[3] .. ' ' .. ARGV[2])
return at
`)

var deleteScript = redis.NewScript(`
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], 'del ' .. ARGV[1])
return n
`)

// markScript returns the mark of a stored record (its first bytes: magic
// and MAC), or "" if there is none, without sending the record.
var markScript = redis.NewScript(fmt.Sprintf(`
local r = redis.call('HGET', KEYS[1], 'rec')
if not r then return '' end
return string.sub(r, 1, %d)
`, markBytes))

// Put stores r as its cluster's latest snapshot and announces it to every
// replica. It gives the record its sequence: this replica's clock in
// nanoseconds, or one more than the newest it has seen of the cluster if
// that is greater (so a record is newer than every one its writer read,
// whatever the clocks of the replicas that wrote them). It returns the
// record's mark, which Stamp reads back while the store holds it.
func (s *Store) Put(ctx context.Context, r Record) (string, error) {
	if err := checkCluster(r.Cluster); err != nil {
		return "", err
	}
	r.Sequence = s.nextSequence(r.Cluster)
	rec, err := seal(s.cfg.Key, r)
	if err != nil {
		return "", err
	}
	if len(rec) > s.cfg.maxRecordBytes() {
		return "", fmt.Errorf("snapshot of cluster %s: %d bytes, more than the %d a record may hold", r.Cluster, len(rec), s.cfg.maxRecordBytes())
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout+time.Duration(len(rec)>>20)*time.Second)
	defer cancel()
	err = putScript.Run(ctx, s.rdb, []string{s.key(r.Cluster), s.channel()}, rec, r.Cluster, r.Snapshot.GetHash()).Err()
	s.count("put", err)
	if err != nil {
		return "", fmt.Errorf("store the snapshot of cluster %s: %w", r.Cluster, s.wrap(err))
	}
	return mark(rec), nil
}

// nextSequence is the sequence of cluster's next record, now the newest.
func (s *Store) nextSequence(cluster string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := max(uint64(max(s.cfg.Now().UnixNano(), 0)), s.newest[cluster]+1)
	s.newest[cluster] = seq
	return seq
}

// admit reports whether a verified record of cluster with seq is not older
// than the newest this Store has seen of it, which it then is.
func (s *Store) admit(cluster string, seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq < s.newest[cluster] {
		return false
	}
	s.newest[cluster] = seq
	return true
}

// Stamp returns the mark of cluster's stored record ("" if none): its
// magic and MAC, which only the record this replica sealed for that
// snapshot and sequence carries, read without sending the record. The
// replica holding a cluster's session compares it with what Put returned,
// to write again a record that was replaced, deleted or written back.
func (s *Store) Stamp(ctx context.Context, cluster string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	m, err := markScript.Run(ctx, s.rdb, []string{s.key(cluster)}).Text()
	s.count("get", err)
	if err != nil {
		return "", s.wrap(err)
	}
	if m == "" {
		return "", nil
	}
	return mark([]byte(m)), nil
}

// Get reads and verifies cluster's record and the store's time of it. A
// record that does not verify is ErrRecord; one older than a record of the
// cluster this Store has read or written, ErrReplayed (which wraps
// ErrRecord); none stored, ErrNotFound.
func (s *Store) Get(ctx context.Context, cluster string) (*Record, string, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 4*s.cfg.Timeout)
	defer cancel()
	vals, err := s.rdb.HMGet(ctx, s.key(cluster), "rec", "at").Result()
	if err != nil {
		s.count("get", err)
		return nil, "", s.wrap(err)
	}
	rec, _ := vals[0].(string)
	at, _ := vals[1].(string)
	if rec == "" {
		s.count("get", nil)
		return nil, "", ErrNotFound
	}
	r, err := open(s.cfg.Key, []byte(rec), cluster, s.cfg.maxRecordBytes(), s.cfg.Limits)
	if err != nil {
		s.requests.WithLabelValues("get", "refused").Inc()
		return nil, at, err
	}
	if !s.admit(cluster, r.Sequence) {
		s.requests.WithLabelValues("get", "replayed").Inc()
		return nil, at, ErrReplayed
	}
	s.count("get", nil)
	return r, at, nil
}

// exists tells whether cluster has a record.
func (s *Store) exists(ctx context.Context, cluster string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	n, err := s.rdb.Exists(ctx, s.key(cluster)).Result()
	s.count("get", err)
	if err != nil {
		return false, s.wrap(err)
	}
	return n > 0, nil
}

// Delete removes cluster's record (it was deregistered) and announces it.
func (s *Store) Delete(ctx context.Context, cluster string) error {
	if err := checkCluster(cluster); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	err := deleteScript.Run(ctx, s.rdb, []string{s.key(cluster), s.channel()}, cluster).Err()
	s.count("delete", err)
	if err != nil {
		return fmt.Errorf("delete the snapshot of cluster %s: %w", cluster, s.wrap(err))
	}
	return nil
}

// Clusters lists the clusters with a record, with the store's time of
// each.
func (s *Store) Clusters(ctx context.Context) (map[string]string, error) {
	stamps, err := s.stamps(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(stamps))
	for c, st := range stamps {
		out[c] = st.at
	}
	return out, nil
}

// stamp is what the store says of a record without reading it: its time
// and the hash of its snapshot.
type stamp struct{ at, hash string }

// stamps lists the clusters with a record and the stamp of each.
func (s *Store) stamps(ctx context.Context) (map[string]stamp, error) {
	ctx, cancel := context.WithTimeout(ctx, 12*s.cfg.Timeout)
	defer cancel()
	prefix := s.key("")
	var keys []string
	iter := s.rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		s.count("list", err)
		return nil, s.wrap(err)
	}
	out := make(map[string]stamp, len(keys))
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "at", "hash")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		s.count("list", err)
		return nil, s.wrap(err)
	}
	for i, k := range keys {
		cluster := strings.TrimPrefix(k, prefix)
		vals, err := cmds[i].Result()
		if err != nil || checkCluster(cluster) != nil {
			continue
		}
		at, _ := vals[0].(string)
		hash, _ := vals[1].(string)
		if at != "" {
			out[cluster] = stamp{at: at, hash: hash}
		}
	}
	s.count("list", nil)
	return out, nil
}

func (s *Store) count(op string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.requests.WithLabelValues(op, result).Inc()
}

// wrap makes a Redis error safe to log: go-redis errors name the address
// and the command, never the password; an authentication failure is said
// plainly.
func (s *Store) wrap(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") {
		return fmt.Errorf("snapshot store %s refused the credentials (username, password)", s.cfg.Address)
	}
	return fmt.Errorf("snapshot store %s: %w", s.cfg.Address, err)
}

// StoreAnswered tells whether err came from the store itself: the
// connection was made and then closed or reset (a store that is stopping or
// starting), or Redis answered with an error. Such a failure says the store
// is failing, not that the network between this replica and the store is
// cut: a replica cut off from it gets timeouts, or refusals from whatever
// rejects its packets.
func StoreAnswered(err error) bool {
	var re redis.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.As(err, &re)
}

// checkCluster refuses a name that could not be a registered cluster's
// (identity.ValidateClusterName: a DNS label), so no name reaches another
// key or breaks a message.
func checkCluster(cluster string) error { return identity.ValidateClusterName(cluster) }
