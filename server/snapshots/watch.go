package snapshots

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/relaymesh/relaymesh/internal/backoff"
)

// Event is a change of one cluster's record.
type Event struct {
	Cluster string
	// Record is the cluster's record as stored now; nil: it was deleted.
	Record *Record
	// At is the store's time of the record.
	At string
}

// Handler receives a Watch's events on the Watch's goroutine, one at a
// time.
type Handler interface {
	// Changed is called with a cluster's new record, verified and not
	// older than one the Watch delivered, or nil Record once a delete was
	// announced and the store holds no record of the cluster. A delete
	// announcement is not authenticated (anyone who can write to the store
	// can DEL a record and announce it): the handler MUST NOT drop what it
	// holds of a cluster its own registry still lists.
	Changed(Event)
	// Synced is called after the watch (re)subscribed and compared every
	// stored record with what it had delivered: the handler holds the
	// store's state as of the subscription. Events missed while the
	// connection was down are covered by it, except deletes: a record
	// deleted meanwhile is not announced again (a deleted cluster was
	// deregistered, which every replica also learns from the apiserver).
	Synced()
	// Lost is called when the subscription ended (the connection dropped
	// or stopped answering); the handler keeps what it has until Synced.
	Lost(error)
}

// RefusedHandler is a Handler that is also told of every record the Watch
// refused (ErrRecord: it does not verify, or it is a replay, ErrReplayed):
// the store no longer holds a good record of that cluster, and the
// replica holding its session should write it again.
type RefusedHandler interface {
	Refused(cluster string, err error)
}

// Watch delivers every change of every cluster's record to h until ctx
// ends: it subscribes to the store's announcements, then reads every record
// that is new to it, and again after every reconnection. A record that
// does not verify is logged and skipped (the handler keeps the last good
// one of that cluster). It returns ctx's error.
func (s *Store) Watch(ctx context.Context, h Handler) error {
	seen := map[string]stamp{} // cluster → the stamp delivered
	retry := backoff.Policy{Min: 200 * time.Millisecond, Max: 2 * time.Second}
	for attempt := 0; ; attempt = min(attempt+1, 20) {
		synced, err := s.watchOnce(ctx, h, seen)
		s.subscribed.Set(0)
		if synced {
			attempt = 0
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.requests.WithLabelValues("watch", "error").Inc()
		h.Lost(err)
		wait := retry.Delay(attempt)
		s.log.Warn("snapshot store subscription lost; serving the snapshots read so far until it is back", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// watchOnce runs one subscription until it fails; synced tells whether it
// got as far as a resync.
func (s *Store) watchOnce(ctx context.Context, h Handler, seen map[string]stamp) (synced bool, err error) {
	ps := s.rdb.Subscribe(ctx)
	defer ps.Close()
	if err := ps.Subscribe(ctx, s.channel()); err != nil {
		return false, s.wrap(err)
	}
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, s.cfg.Timeout/2)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged && ctx.Err() == nil {
				// Quiet, or cut off without a reset: a ping tells.
				if err := ps.Ping(ctx); err != nil {
					return synced, s.wrap(err)
				}
				pinged = true
				continue
			}
			return synced, s.wrap(err)
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			if err := s.resync(ctx, h, seen); err != nil {
				return synced, err
			}
			synced = true
			s.subscribed.Set(1)
			h.Synced()
		case *redis.Message:
			s.announced(ctx, h, seen, m.Payload)
		case *redis.Pong:
		}
	}
}

// resync reads every record whose stamp differs from the one delivered.
func (s *Store) resync(ctx context.Context, h Handler, seen map[string]stamp) error {
	stored, err := s.stamps(ctx)
	if err != nil {
		return err
	}
	for cluster, st := range stored {
		s.changed(ctx, h, seen, cluster, st)
	}
	return nil
}

// changed handles a record whose stamp may be new: a record of the content
// delivered last (the same snapshot hash, rewritten by a replica after the
// store was emptied) is not read again.
func (s *Store) changed(ctx context.Context, h Handler, seen map[string]stamp, cluster string, st stamp) {
	prev, ok := seen[cluster]
	switch {
	case ok && prev.at == st.at:
	case ok && st.hash != "" && prev.hash == st.hash:
		seen[cluster] = st
	default:
		s.deliver(ctx, h, seen, cluster)
	}
}

// announced handles one announcement; none is authenticated, so none is
// acted on alone (see announcement): a put is a reason to read the record
// and verify it, a delete is delivered only if the store confirms that
// the record is gone.
func (s *Store) announced(ctx context.Context, h Handler, seen map[string]stamp, payload string) {
	a, err := parseAnnouncement(payload)
	if err != nil {
		s.log.Warn("ignored a malformed announcement in the snapshot store", "length", len(payload))
		return
	}
	switch a.op {
	case "put":
		s.changed(ctx, h, seen, a.cluster, stamp{at: a.at, hash: a.hash})
	case "del":
		if _, ok := seen[a.cluster]; !ok {
			return
		}
		present, err := s.exists(ctx, a.cluster)
		switch {
		case err != nil:
			s.log.Warn("could not check a delete announced in the snapshot store; keeping the cluster's last record", "cluster", a.cluster, "error", err)
		case present:
			s.log.Warn("ignored a delete announced in the snapshot store: the record is still there (a forged announcement)", "cluster", a.cluster)
		default:
			delete(seen, a.cluster)
			h.Changed(Event{Cluster: a.cluster})
		}
	}
}

// deliver reads cluster's record and hands it to h. A read that fails is
// left for the next announcement or resync; a record that does not verify
// is marked seen, so it is not read again until it changes.
func (s *Store) deliver(ctx context.Context, h Handler, seen map[string]stamp, cluster string) {
	r, at, err := s.Get(ctx, cluster)
	switch {
	case errors.Is(err, ErrNotFound):
		return
	case errors.Is(err, ErrRecord):
		seen[cluster] = stamp{at: at}
		s.log.Error("refused a snapshot record from the store; keeping the last good one of this cluster", "cluster", cluster, "error", err)
		if rh, ok := h.(RefusedHandler); ok {
			rh.Refused(cluster, err)
		}
		return
	case err != nil:
		s.log.Warn("could not read a snapshot from the store; it is read again at the next change or reconnection", "cluster", cluster, "error", err)
		return
	}
	seen[cluster] = stamp{at: at, hash: r.Snapshot.GetHash()}
	h.Changed(Event{Cluster: cluster, Record: r, At: at})
}
