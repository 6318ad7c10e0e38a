package servertest

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// RawConn is an HTTP/2 client speaking frames directly, as an attacker
// would: no gRPC library between the test and the wire.
type RawConn struct {
	t    testing.TB
	conn *tls.Conn
	fr   *http2.Framer
	wmu  sync.Mutex
	hbuf bytes.Buffer
	henc *hpack.Encoder
	next uint32
	// closed is closed when the server ends the connection (EOF or
	// GOAWAY); statuses collects grpc-status per stream.
	closed   chan struct{}
	mu       sync.Mutex
	statuses map[uint32]string
	goaway   bool
}

// DialRaw opens a TLS connection to addr (from the local address, if set)
// and starts HTTP/2 on it.
func DialRaw(t testing.TB, addr string, cfg *tls.Config, local string) (*RawConn, error) {
	t.Helper()
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return nil, err
	}
	r := &RawConn{t: t, conn: c, fr: http2.NewFramer(c, c), next: 1, closed: make(chan struct{}), statuses: map[uint32]string{}}
	r.henc = hpack.NewEncoder(&r.hbuf)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := r.fr.WriteSettings(); err != nil {
		return nil, err
	}
	go r.read()
	t.Cleanup(func() { _ = c.Close() })
	return r, nil
}

func (r *RawConn) read() {
	defer close(r.closed)
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				r.wmu.Lock()
				_ = r.fr.WriteSettingsAck()
				r.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			if st := f.PseudoValue("status"); st != "" && st != "200" {
				r.mu.Lock()
				r.statuses[f.StreamID] = "http " + st
				r.mu.Unlock()
			}
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					r.mu.Lock()
					r.statuses[f.StreamID] = hf.Value
					r.mu.Unlock()
				}
			}
		case *http2.GoAwayFrame:
			r.mu.Lock()
			r.goaway = true
			r.mu.Unlock()
		case *http2.PingFrame:
			if !f.IsAck() {
				r.wmu.Lock()
				_ = r.fr.WritePing(true, f.Data)
				r.wmu.Unlock()
			}
		}
	}
}

// Headers opens a stream calling method; it returns the stream id.
func (r *RawConn) Headers(method string, endStream bool) (uint32, error) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.hbuf.Reset()
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := r.henc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}); err != nil {
			return 0, err
		}
	}
	id := r.next
	r.next += 2
	return id, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndStream: endStream, EndHeaders: true})
}

// Data sends b on stream id.
func (r *RawConn) Data(id uint32, b []byte, end bool) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	return r.fr.WriteData(id, end, b)
}

// Reset cancels stream id.
func (r *RawConn) Reset(id uint32) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	return r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
}

// Status is the grpc-status (or "http <code>") stream id ended with, or "".
func (r *RawConn) Status(id uint32) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.statuses[id]
}

// IsClosed reports whether the server ended the connection within d.
func (r *RawConn) IsClosed(d time.Duration) bool {
	select {
	case <-r.closed:
		return true
	case <-time.After(d):
		return false
	}
}

// GRPCHeader is the 5-byte gRPC message prefix declaring n bytes.
func GRPCHeader(n uint32) []byte {
	h := make([]byte, 5)
	binary.BigEndian.PutUint32(h[1:], n)
	return h
}

// Closed is closed when the server ends the connection.
func (r *RawConn) Closed() <-chan struct{} { return r.closed }

// Close closes the connection.
func (r *RawConn) Close() error { return r.conn.Close() }
