package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/internal/backoff"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// SessionConfig configures an agent's session with the server.
type SessionConfig struct {
	// ServerAddress is host:port of the relay server.
	ServerAddress string
	// TLS returns the mTLS client config (pinned roots, newest certificate).
	TLS func() (*tls.Config, error)
	// Version is sent in Hello.
	Version string
	// PingInterval between keepalive pings; default 10s.
	PingInterval time.Duration
	// Retry bounds reconnect backoff; default 1s..30s with jitter.
	Retry backoff.Policy
	// OnRefused is called when the server refuses the agent's certificate
	// (PermissionDenied or Unauthenticated), so the credential manager can
	// drop it; optional.
	OnRefused func(error)
	Logger    *slog.Logger
}

// SessionState is what the agent knows about its session.
type SessionState struct {
	Connected  bool      `json:"connected"`
	Cluster    string    `json:"cluster,omitempty"`
	SPIFFEID   string    `json:"spiffeID,omitempty"`
	Since      time.Time `json:"since,omitzero"`
	Reconnects int64     `json:"reconnects"`
	LastError  string    `json:"lastError,omitempty"`
}

// Session keeps one relay session open, reconnecting with backoff.
type Session struct {
	cfg        SessionConfig
	log        *slog.Logger
	mu         sync.RWMutex
	state      SessionState
	reconnects atomic.Int64
}

// NewSession validates cfg.
func NewSession(cfg SessionConfig) (*Session, error) {
	if cfg.ServerAddress == "" || cfg.TLS == nil {
		return nil, errors.New("relay session: serverAddress and tls are required")
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 10 * time.Second
	}
	if cfg.Retry.Min == 0 {
		cfg.Retry = backoff.Policy{Min: time.Second, Max: 30 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Session{cfg: cfg, log: cfg.Logger.With("component", "relay-session")}, nil
}

// State returns the session state.
func (s *Session) State() SessionState {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.state
	st.Reconnects = s.reconnects.Load()
	return st
}

// Run holds the session until ctx ends.
func (s *Session) Run(ctx context.Context) error {
	attempt := 0
	for {
		start := time.Now()
		err := s.once(ctx)
		s.mu.Lock()
		s.state.Connected = false
		if err != nil {
			s.state.LastError = err.Error()
		}
		s.mu.Unlock()
		if c := status.Code(err); (c == codes.PermissionDenied || c == codes.Unauthenticated) && s.cfg.OnRefused != nil {
			s.cfg.OnRefused(err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start) > time.Minute {
			attempt = 0 // a long session resets the backoff
		}
		delay := s.cfg.Retry.Delay(attempt)
		attempt++
		s.reconnects.Add(1)
		s.log.Warn("relay session ended; reconnecting", "error", err, "retry_in", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

func (s *Session) once(ctx context.Context) error {
	tlsCfg, err := s.cfg.TLS()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(s.cfg.ServerAddress, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := relaypb.NewRelayClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Hello{Hello: &relaypb.Hello{AgentVersion: s.cfg.Version}}}); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	w := first.GetWelcome()
	if w == nil {
		return errors.New("server did not answer Hello with Welcome")
	}
	s.mu.Lock()
	s.state = SessionState{Connected: true, Cluster: w.GetCluster(), SPIFFEID: w.GetSpiffeId(), Since: time.Now()}
	s.mu.Unlock()
	s.log.Info("relay session open", "cluster", w.GetCluster(), "spiffe_id", w.GetSpiffeId())

	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				errc <- err
				return
			}
		}
	}()
	tick := time.NewTicker(s.cfg.PingInterval)
	defer tick.Stop()
	var nonce int64
	for {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			nonce++
			if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Ping{Ping: &relaypb.Ping{Nonce: nonce}}}); err != nil {
				return err
			}
		}
	}
}
