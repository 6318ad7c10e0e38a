package dataplane

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Client calls the Echo service of a Service through gRPC's xDS client:
// every call is routed by what istiod sent the calling workload.
type Client struct {
	from   string
	target string
	conn   *grpc.ClientConn
	closed func(*Client) // tells the workload, which then forgets it

	closeOnce sync.Once
	closeErr  error
}

// Close closes the client's connections (and its own xDS stream). It is
// safe to call twice; the workload closes its clients when it stops.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.conn.Close()
		if c.closed != nil {
			c.closed(c)
		}
	})
	return c.closeErr
}

// Target is the xds:/// target the client dials.
func (c *Client) Target() string { return c.target }

// Limits of a batch.
const (
	// DefaultCallTimeout is each call's own deadline unless CallOptions
	// says otherwise: longer than any route timeout a test sets, so a
	// DeadlineExceeded comes from the route, not from the caller.
	DefaultCallTimeout = 10 * time.Second
	// DefaultConcurrency is how many calls of a batch are in flight.
	DefaultConcurrency = 8
	// MaxBatch bounds one Run.
	MaxBatch = 100_000
)

// CallOptions shape the calls of a batch.
type CallOptions struct {
	// Request is what each call asks of the server.
	Request Request
	// Headers are sent as request metadata (header-match routes read
	// them). Keys must be lower case; binary ("-bin") keys are refused.
	Headers map[string]string
	// Timeout is each call's own deadline; default DefaultCallTimeout.
	Timeout time.Duration
	// Concurrency is how many calls are in flight; default
	// DefaultConcurrency.
	Concurrency int
}

func (o CallOptions) validate() error {
	var errs []error
	for _, k := range sortedKeys(o.Headers) {
		if len(k) > 128 || !headerKey.MatchString(k) || strings.HasSuffix(k, "-bin") || strings.HasPrefix(k, "grpc-") {
			errs = append(errs, fmt.Errorf("headers: %.40q is not a plain lower-case metadata key", k))
		}
		if v := o.Headers[k]; len(v) > 1024 || !printable(v) {
			errs = append(errs, fmt.Errorf("headers[%.40s]: value is not up to 1024 printable ASCII characters", k))
		}
	}
	if o.Request.Delay < 0 || o.Request.Delay > MaxDelay {
		errs = append(errs, fmt.Errorf("request.delay: %v is outside [0, %v]", o.Request.Delay, MaxDelay))
	}
	if o.Timeout < 0 {
		errs = append(errs, errors.New("timeout: must not be negative"))
	}
	if o.Concurrency < 0 || o.Concurrency > 256 {
		errs = append(errs, fmt.Errorf("concurrency: %d is outside [0, 256]", o.Concurrency))
	}
	return errors.Join(errs...)
}

var headerKey = regexp.MustCompile(`^[a-z0-9][-a-z0-9_.]*$`)

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Call makes one call and returns who answered, or the call's error (a
// gRPC status error).
func (c *Client) Call(ctx context.Context, opts CallOptions) (Reply, error) {
	if err := opts.validate(); err != nil {
		return Reply{}, err
	}
	r, _, err := c.call(ctx, opts)
	return r, err
}

// call makes one call and returns the reply and the issuer (IssuerID) of
// the server's certificate, "" over plaintext.
func (c *Client) call(ctx context.Context, opts CallOptions) (Reply, string, error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultCallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if len(opts.Headers) > 0 {
		md := metadata.MD{}
		for k, v := range opts.Headers {
			md.Set(k, v)
		}
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	out := new(structpb.Struct)
	var p peer.Peer
	if err := c.conn.Invoke(ctx, EchoMethod, opts.Request.Encode(), out, grpc.Peer(&p)); err != nil {
		return Reply{}, "", err
	}
	r, err := DecodeReply(out)
	if err != nil {
		return Reply{}, "", status.Error(codes.Internal, "bad reply: "+err.Error())
	}
	_, issuer := tlsIdentity(p.AuthInfo)
	return r, issuer, nil
}

// Run makes n calls, opts.Concurrency at a time, and counts their outcomes.
// A cancelled ctx stops the batch early; the calls made are counted.
func (c *Client) Run(ctx context.Context, n int, opts CallOptions) (*Outcomes, error) {
	if n < 1 || n > MaxBatch {
		return nil, fmt.Errorf("run: %d calls is outside [1, %d]", n, MaxBatch)
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	workers := opts.Concurrency
	if workers == 0 {
		workers = DefaultConcurrency
	}
	workers = min(workers, n)
	out := NewOutcomes()
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range jobs {
				r, issuer, err := c.call(ctx, opts)
				st := status.Convert(err)
				out.add(st.Code(), r, issuer, st.Message())
			}
		})
	}
feed:
	for range n {
		select {
		case jobs <- struct{}{}:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	out.setElapsed(time.Since(start))
	return out, nil
}
