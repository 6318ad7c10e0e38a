package relaytest

import (
	"bytes"
	"context"
	"sync"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EmptyWorkloads is n empty Workload messages of a Snapshot (field 3),
// two bytes each: of all encodings, the one whose decoding takes the most
// memory per byte.
func EmptyWorkloads(n int) []byte {
	return bytes.Repeat([]byte{3<<3 | 2, 0}, n)
}

// Holder is a compromised cluster's agent trying to hold the server's
// memory for snapshots in transit (Discovery.PushChunked): on a stream of
// its own it sends a header announcing Announce bytes in parts of 64 KiB,
// then Parts of those parts (EmptyWorkloads, Every apart), then nothing,
// for as long as the server keeps the stream; whenever the server ends it,
// it opens another after Retry, until its context ends.
type Holder struct {
	Client  relaypb.DiscoveryClient
	Cluster string
	// Announce is the size its headers announce (default 64 MiB, the
	// largest a server takes); Parts how many parts it sends (0: a header
	// only); Every the pause before each part; Retry the pause before a
	// new stream (default 100ms).
	Announce uint64
	Parts    int
	Every    time.Duration
	Retry    time.Duration

	mu       sync.Mutex
	refusals map[codes.Code]int
	last     string
}

// HolderPart is the size of a Holder's parts: the least the server takes
// before the last.
const HolderPart = 64 << 10

// Run holds until ctx ends.
func (h *Holder) Run(ctx context.Context) {
	if h.Announce == 0 {
		h.Announce = 64 << 20
	}
	if h.Retry == 0 {
		h.Retry = 100 * time.Millisecond
	}
	part := EmptyWorkloads(HolderPart / 2)
	header := Header(h.Cluster, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", int(h.Announce), int(h.Announce/HolderPart))
	for ctx.Err() == nil {
		err := h.hold(ctx, header, part)
		h.mu.Lock()
		if ctx.Err() == nil {
			if h.refusals == nil {
				h.refusals = map[codes.Code]int{}
			}
			h.refusals[status.Code(err)]++
			h.last = status.Convert(err).Message()
		}
		h.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(h.Retry):
		}
	}
}

// hold runs one stream until the server ends it.
func (h *Holder) hold(ctx context.Context, header *relaypb.SnapshotChunk, part []byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.Client.PushChunked(ctx)
	if err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		ended <- err
	}()
	if err := stream.Send(header); err != nil {
		return <-ended
	}
	for i := range h.Parts {
		select {
		case err := <-ended:
			return err
		case <-time.After(h.Every):
		}
		if err := stream.Send(Part(i, part)); err != nil {
			return <-ended
		}
	}
	return <-ended
}

// Refusals counts the streams the server ended, by status code; last is
// the message of the last.
func (h *Holder) Refusals() (map[codes.Code]int, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[codes.Code]int, len(h.refusals))
	for c, n := range h.refusals {
		out[c] = n
	}
	return out, h.last
}
