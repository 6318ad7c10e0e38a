// Package dialer parses the relay server's addresses (one, or the replicas
// of a highly available management plane) and connects an agent to one of
// them. The agent's session (agent.Session) and its credential calls
// (identity.Manager) each dial one replica at a time, the first a random
// one: a session moves to the next replica after it ends, a credential
// call after it fails, so agents spread across replicas and fail over
// without a load balancer in front of them. Neither hands gRPC the list:
// its pick_first dials the next address whenever a handshake takes over
// 250 ms, so in a storm, when every server is slow, every agent would
// handshake with every replica.
package dialer

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
)

// MaxAddresses bounds a list: more replicas than this is a typo.
const MaxAddresses = 64

// ConnectTimeout bounds one connection attempt to one address, so a replica
// cut off from the network (packets dropped, no refusal) costs this long
// before the next is tried, not gRPC's default 20 s.
const ConnectTimeout = 3 * time.Second

// Parse splits a comma-separated list of host:port addresses; each must
// have a host and a port in 1..65535, and none may repeat.
func Parse(list string) ([]string, error) {
	if len(list) > 16<<10 {
		return nil, fmt.Errorf("server address list is %d bytes, at most 16 KiB", len(list))
	}
	var out []string
	seen := map[string]bool{}
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return nil, fmt.Errorf("server address %q is not host:port", text.Truncate(a, 100))
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("server address %q: port must be 1..65535", text.Truncate(a, 100))
		}
		if seen[a] {
			return nil, fmt.Errorf("server address %q is listed twice", text.Truncate(a, 100))
		}
		seen[a] = true
		out = append(out, a)
	}
	if len(out) > MaxAddresses {
		return nil, fmt.Errorf("%d server addresses, at most %d", len(out), MaxAddresses)
	}
	return out, nil
}

// ServerName is the name the server's certificate must carry when the
// caller gave none: the host of the only address. Several addresses need
// an explicit name (one the serving certificate of every replica carries).
func ServerName(addresses []string) (string, error) {
	if len(addresses) != 1 {
		return "", errors.New("several server addresses need --server-name: a DNS name or IP every replica's certificate carries")
	}
	host, _, err := net.SplitHostPort(addresses[0])
	return host, err
}

// Dial returns a client connection to the relay server at address (one of
// Parse's), authenticated by tlsCfg, whose attempts to connect end after
// ConnectTimeout.
func Dial(address string, tlsCfg *tls.Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if address == "" {
		return nil, errors.New("no server address")
	}
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: ConnectTimeout,
			Backoff: backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}}),
	}, opts...)
	return grpc.NewClient(address, opts...)
}
