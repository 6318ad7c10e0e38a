package server

import (
	"strings"
	"testing"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type recordingSource struct {
	current, serving *relaypb.TrustBundle
	servingAsked     int
	acks             []*relaypb.TrustBundleAck
}

func (r *recordingSource) Current() *relaypb.TrustBundle { return r.current }
func (r *recordingSource) Serving() *relaypb.TrustBundle {
	r.servingAsked++
	return r.serving
}
func (r *recordingSource) Acknowledged(_ string, _ bool, a *relaypb.TrustBundleAck) {
	r.acks = append(r.acks, a)
}

func TestAMalformedTrustBundleAcknowledgementIsRefusedAndRecordsNothing(t *testing.T) {
	good := strings.Repeat("ab", 32)
	for name, ack := range map[string]*relaypb.TrustBundleAck{
		"empty fingerprint":    {},
		"not hex":              {Fingerprint: strings.Repeat("zz", 32)},
		"too long":             {Fingerprint: good + "00"},
		"too short":            {Fingerprint: good[:62]},
		"an oversized refusal": {Fingerprint: good, Error: strings.Repeat("x", maxAckErrorLen+1)},
	} {
		t.Run(name, func(t *testing.T) {
			src := &recordingSource{}
			d := &bundleDelivery{src: src, cluster: "c1", can: true}
			if err := d.acknowledged(ack); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if len(src.acks) != 0 {
				t.Fatal("a malformed acknowledgement was recorded")
			}
		})
	}
	src := &recordingSource{}
	d := &bundleDelivery{src: src, cluster: "c1", can: true, sent: good}
	if err := d.acknowledged(&relaypb.TrustBundleAck{Fingerprint: good, Error: "refused"}); err != nil || len(src.acks) != 1 {
		t.Fatalf("a well-formed refusal: err %v, %d recorded", err, len(src.acks))
	}
}

// An agent answering a bundle its session was never sent (or an older one)
// records nothing: otherwise it could make its replica write its
// KubernetesCluster at will.
func TestAnUnsolicitedTrustBundleAcknowledgementRecordsNothing(t *testing.T) {
	good, other := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	for name, sent := range map[string]string{"nothing sent": "", "another bundle sent": other} {
		t.Run(name, func(t *testing.T) {
			src := &recordingSource{}
			d := &bundleDelivery{src: src, cluster: "c1", can: true, sent: sent}
			if err := d.acknowledged(&relaypb.TrustBundleAck{Fingerprint: good}); err != nil {
				t.Fatalf("a well-formed acknowledgement ends the session: %v", err)
			}
			if len(src.acks) != 0 {
				t.Fatal("an acknowledgement of a bundle this session did not send was recorded")
			}
		})
	}
}

// sentStream records the bundles a session sends.
type sentStream struct {
	sent []*relaypb.ServerMessage
}

func (s *sentStream) Send(b *relaypb.TrustBundle) error {
	s.sent = append(s.sent, &relaypb.ServerMessage{Msg: &relaypb.ServerMessage_TrustBundle{TrustBundle: b}})
	return nil
}

// Outside a rotation only an agent that reported other pinned roots gets
// the roots the replica serves under; during one, every agent gets the
// rotation's bundle; an agent that cannot acknowledge gets nothing.
func TestBundleOfferedToAnAgentPinningOtherRootsOutsideARotation(t *testing.T) {
	serving := &relaypb.TrustBundle{Fingerprint: strings.Repeat("ab", 32), RootsPem: []byte("new")}
	rotation := &relaypb.TrustBundle{Fingerprint: strings.Repeat("cd", 32), RootsPem: []byte("old+new"), Revision: 3}
	old := strings.Repeat("ef", 32)
	for _, tc := range []struct {
		name    string
		current *relaypb.TrustBundle
		hello   *relaypb.Hello
		want    *relaypb.TrustBundle
	}{
		{"pins the retired root", nil, &relaypb.Hello{TrustBundles: true, PinnedRootsFingerprint: old}, serving},
		{"pins the serving roots", nil, &relaypb.Hello{TrustBundles: true, PinnedRootsFingerprint: serving.GetFingerprint()}, nil},
		{"reports no pinned roots", nil, &relaypb.Hello{TrustBundles: true}, nil},
		{"cannot acknowledge", nil, &relaypb.Hello{PinnedRootsFingerprint: old}, nil},
		{"during a rotation", rotation, &relaypb.Hello{TrustBundles: true, PinnedRootsFingerprint: serving.GetFingerprint()}, rotation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &recordingSource{current: tc.current, serving: serving}
			s := &Server{cfg: ServerConfig{TrustBundles: src}}
			d, err := s.newBundleDelivery("c1", tc.hello)
			if err != nil {
				t.Fatal(err)
			}
			st := &sentStream{}
			for range 3 { // at Hello and at two pings: sent at most once
				if err := d.offer(st.Send); err != nil {
					t.Fatal(err)
				}
			}
			switch {
			case tc.want == nil && len(st.sent) != 0:
				t.Fatalf("sent %v, want nothing", st.sent)
			case tc.want != nil && (len(st.sent) != 1 || st.sent[0].GetTrustBundle().GetFingerprint() != tc.want.GetFingerprint()):
				t.Fatalf("sent %v, want the bundle %s once", st.sent, tc.want.GetFingerprint())
			}
			if src.servingAsked > 1 {
				t.Fatalf("the serving roots were compared %d times in one session: once is enough, not at every ping", src.servingAsked)
			}
		})
	}
}

func TestAMalformedPinnedRootsFingerprintEndsTheSession(t *testing.T) {
	s := &Server{cfg: ServerConfig{TrustBundles: &recordingSource{}}}
	for name, fp := range map[string]string{
		"not hex":   strings.Repeat("zz", 32),
		"too short": strings.Repeat("ab", 31),
		"too long":  strings.Repeat("ab", 33),
		"oversized": strings.Repeat("ab", 1<<15),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := s.newBundleDelivery("c1", &relaypb.Hello{TrustBundles: true, PinnedRootsFingerprint: fp}); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
		})
	}
}
