package server

import (
	"strings"
	"testing"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type recordingSource struct{ acks []*relaypb.TrustBundleAck }

func (r *recordingSource) Current() *relaypb.TrustBundle { return nil }
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
