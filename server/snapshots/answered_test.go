package snapshots_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What the store itself answered (a closed or reset connection, an error
// reply) is told from what never reached it (a refused or silent address),
// with the errors a real redis-server and real sockets give.
func TestStoreAnswered(t *testing.T) {
	r := startRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An error reply from the real server.
	reply := raw(t, r).Do(ctx, "NOSUCHCOMMAND").Err()
	require.Error(t, reply)
	assert.True(t, snapshots.StoreAnswered(fmt.Errorf("snapshot store x: %w", reply)), "an error reply: %v", reply)

	// A connection the peer closes at once (a store stopping): EOF.
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer closing.Close()
	go func() {
		for {
			c, err := closing.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	eof := redis.NewClient(&redis.Options{Addr: closing.Addr().String(), MaxRetries: -1, DialTimeout: time.Second}).Ping(ctx).Err()
	require.Error(t, eof)
	assert.True(t, snapshots.StoreAnswered(eof), "closed by the peer: %v", eof)

	// Nothing listening: refused; a silent address: a timeout.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := gone.Addr().String()
	require.NoError(t, gone.Close())
	refused := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second}).Ping(ctx).Err()
	require.Error(t, refused)
	assert.False(t, snapshots.StoreAnswered(refused), "refused: %v", refused)

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	timeout := redis.NewClient(&redis.Options{Addr: silent.Addr().String(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond}).Ping(ctx).Err()
	require.Error(t, timeout)
	assert.False(t, snapshots.StoreAnswered(timeout), "silent: %v", timeout)
	assert.False(t, snapshots.StoreAnswered(errors.New("test: connection lost")))
}
