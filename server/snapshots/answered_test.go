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
	ping := func(addr string, timeout time.Duration) error {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: timeout, ReadTimeout: timeout})
		defer c.Close()
		return c.Ping(ctx).Err()
	}
	eof := ping(closing.Addr().String(), time.Second)
	require.Error(t, eof)
	assert.True(t, snapshots.StoreAnswered(eof), "closed by the peer: %v", eof)

	// Nothing listening: refused; a silent address: a timeout.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := gone.Addr().String()
	require.NoError(t, gone.Close())
	refused := ping(addr, time.Second)
	require.Error(t, refused)
	assert.False(t, snapshots.StoreAnswered(refused), "refused: %v", refused)

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	timeout := ping(silent.Addr().String(), 200*time.Millisecond)
	require.Error(t, timeout)
	assert.False(t, snapshots.StoreAnswered(timeout), "silent: %v", timeout)
	assert.False(t, snapshots.StoreAnswered(errors.New("test: connection lost")))
}
