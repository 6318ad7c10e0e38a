package dataplane

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The test service every server workload exposes. Its messages are
// google.protobuf.Struct, so it needs no generated code; routes and
// AuthorizationPolicies match EchoMethod, the gRPC :path.
const (
	EchoService = "relaymesh.dataplane.v1.Echo"
	EchoMethod  = "/" + EchoService + "/Call"
)

// MaxDelay bounds what a request may ask the server to wait.
const MaxDelay = 30 * time.Second

// Limits on a reply's fields, which a client decodes from the wire.
const (
	maxReplyFields = 16
	maxFieldLen    = 512
)

// Fields of the request and reply structs.
const (
	fieldDelayMillis    = "delay_ms"
	fieldWorkload       = "workload"
	fieldNamespace      = "namespace"
	fieldCluster        = "cluster"
	fieldServiceAccount = "service_account"
	fieldVersion        = "version"
	fieldPeer           = "peer"
	fieldPeerIssuer     = "peer_issuer"
)

// Request is what a call asks of the server.
type Request struct {
	// Delay makes the server wait before it answers (timeouts); at most
	// MaxDelay.
	Delay time.Duration
}

// Encode returns r as the wire message.
func (r Request) Encode() *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		fieldDelayMillis: structpb.NewNumberValue(float64(r.Delay / time.Millisecond)),
	}}
}

// DecodeRequest checks and converts the wire message. Unknown fields are
// an error: the server fails closed on what it does not understand.
func DecodeRequest(s *structpb.Struct) (Request, error) {
	var r Request
	for k, v := range s.GetFields() {
		switch k {
		case fieldDelayMillis:
			n, ok := v.GetKind().(*structpb.Value_NumberValue)
			if !ok || math.IsNaN(n.NumberValue) || n.NumberValue < 0 || n.NumberValue > float64(MaxDelay/time.Millisecond) || n.NumberValue != math.Trunc(n.NumberValue) {
				return Request{}, fmt.Errorf("%s: want whole milliseconds in [0, %d]", fieldDelayMillis, MaxDelay/time.Millisecond)
			}
			r.Delay = time.Duration(n.NumberValue) * time.Millisecond
		default:
			return Request{}, fmt.Errorf("unknown field %.40q", k)
		}
	}
	return r, nil
}

// Reply says who answered a call.
type Reply struct {
	// Workload, Namespace, Cluster and ServiceAccount name the answering
	// workload: its Pod, its namespace, its cluster and its identity.
	Workload, Namespace, Cluster, ServiceAccount string
	// Version is the Pod's "version" label: the subset it belongs to.
	Version string
	// Peer is the caller's SPIFFE ID from its mTLS certificate, as the
	// server verified it; empty when the call came over plaintext.
	Peer string
	// PeerIssuer names the CA that issued the caller's certificate
	// (IssuerID); empty over plaintext.
	PeerIssuer string
}

// Encode returns r as the wire message.
func (r Reply) Encode() *structpb.Struct {
	f := map[string]*structpb.Value{}
	for k, v := range map[string]string{
		fieldWorkload: r.Workload, fieldNamespace: r.Namespace, fieldCluster: r.Cluster,
		fieldServiceAccount: r.ServiceAccount, fieldVersion: r.Version, fieldPeer: r.Peer, fieldPeerIssuer: r.PeerIssuer,
	} {
		if v != "" {
			f[k] = structpb.NewStringValue(v)
		}
	}
	return &structpb.Struct{Fields: f}
}

// DecodeReply checks and converts a reply from the wire: string fields
// only, each at most 512 bytes, unknown fields refused.
func DecodeReply(s *structpb.Struct) (Reply, error) {
	var r Reply
	fields := s.GetFields()
	if len(fields) > maxReplyFields {
		return Reply{}, fmt.Errorf("reply has %d fields, at most %d", len(fields), maxReplyFields)
	}
	for k, v := range fields {
		sv, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return Reply{}, fmt.Errorf("reply field %.40q is not a string", k)
		}
		if len(sv.StringValue) > maxFieldLen {
			return Reply{}, fmt.Errorf("reply field %.40q is %d bytes, at most %d", k, len(sv.StringValue), maxFieldLen)
		}
		switch k {
		case fieldWorkload:
			r.Workload = sv.StringValue
		case fieldNamespace:
			r.Namespace = sv.StringValue
		case fieldCluster:
			r.Cluster = sv.StringValue
		case fieldServiceAccount:
			r.ServiceAccount = sv.StringValue
		case fieldVersion:
			r.Version = sv.StringValue
		case fieldPeer:
			r.Peer = sv.StringValue
		case fieldPeerIssuer:
			r.PeerIssuer = sv.StringValue
		default:
			return Reply{}, fmt.Errorf("unknown reply field %.40q", k)
		}
	}
	if r.Workload == "" {
		return Reply{}, errors.New("reply names no workload")
	}
	return r, nil
}

// echoHandler is what the service descriptor dispatches to.
type echoHandler interface {
	call(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error)
}

// echoServiceDesc describes the Echo service by hand: one unary method
// whose messages are Structs.
var echoServiceDesc = grpc.ServiceDesc{
	ServiceName: EchoService,
	HandlerType: (*echoHandler)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Call", Handler: callHandler}},
	Metadata:    "relaymesh/test/dataplane/echo",
}

func callHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	h, ok := srv.(echoHandler)
	if !ok {
		return nil, status.Error(codes.Internal, "echo: no handler")
	}
	in := new(structpb.Struct)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return h.call(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: EchoMethod}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		s, ok := req.(*structpb.Struct)
		if !ok {
			return nil, status.Error(codes.Internal, "echo: unexpected request type")
		}
		return h.call(ctx, s)
	})
}

// echoServer answers for one workload.
type echoServer struct {
	reply  Reply
	served func()
}

func (e *echoServer) call(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	req, err := DecodeRequest(in)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.Delay > 0 {
		t := time.NewTimer(req.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	r := e.reply
	r.Peer, r.PeerIssuer = peerIdentity(ctx)
	e.served()
	return r.Encode(), nil
}

// peerIdentity is the caller's SPIFFE ID and the issuer of its certificate
// from the TLS handshake, or "".
func peerIdentity(ctx context.Context) (id, issuer string) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", ""
	}
	return tlsIdentity(p.AuthInfo)
}

// tlsIdentity is the SPIFFE ID and the issuer (IssuerID) of the peer's
// certificate of a TLS connection, or "" for anything else.
func tlsIdentity(auth credentials.AuthInfo) (id, issuer string) {
	info, ok := auth.(credentials.TLSInfo)
	if !ok {
		return "", ""
	}
	if info.SPIFFEID != nil {
		id = info.SPIFFEID.String()
	}
	if certs := info.State.PeerCertificates; len(certs) > 0 {
		issuer = IssuerID(certs[0])
	}
	return id, issuer
}

// IssuerID names the CA that issued cert by its key: the first 8 bytes of
// the certificate's authority key identifier, in hex. It equals KeyID of
// the issuing CA's certificate.
func IssuerID(cert *x509.Certificate) string { return shortHex(cert.AuthorityKeyId) }

// KeyID names a CA certificate by its key: the first 8 bytes of its
// subject key identifier, in hex.
func KeyID(cert *x509.Certificate) string { return shortHex(cert.SubjectKeyId) }

func shortHex(b []byte) string { return hex.EncodeToString(b[:min(len(b), 8)]) }
