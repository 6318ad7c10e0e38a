package server

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// The second root an agent reports holding (a CrossSigned rotation's step)
// survives the view and the status a leader on another replica reads; a
// value that is not a fingerprint is dropped; results without one keep the
// digest replicas of the previous release compute, so a mixed-version
// ledger still pairs them.
func TestAckCarriesTheCrossIssuer(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	for in, want := range map[string]string{fp: fp, "": "", "ABAB": "", strings.Repeat("zz", 32): "", fp + "00": ""} {
		got := boundedResult(&relaypb.ObjectResult{Kind: "Secret", Outcome: "applied", CrossIssuer: in}).GetCrossIssuer()
		assert.Equal(t, want, got, "%q", in)
	}

	a := &multiclusterv1alpha1.AppliedOutputs{Version: "7", Results: []multiclusterv1alpha1.AppliedResult{
		{APIVersion: "v1", Kind: "Secret", Namespace: "istio-system", Name: "cacerts", Outcome: "applied", CrossIssuer: fp}}}
	ack := ackOf(a)
	assert.Equal(t, fp, ack.GetResults()[0].GetCrossIssuer())

	plain := []multiclusterv1alpha1.AppliedResult{{APIVersion: "v1", Kind: "Secret", Namespace: "istio-system", Name: "cacerts", Outcome: "unchanged"}}
	h := sha256.New()
	for _, f := range []string{"v1", "Secret", "istio-system", "cacerts", "unchanged", ""} {
		h.Write([]byte(strconv.Itoa(len(f)) + ":" + f))
	}
	assert.Equal(t, hex.EncodeToString(h.Sum(nil)), ResultsDigest(plain), "the previous release's digest")
	crossed := []multiclusterv1alpha1.AppliedResult{plain[0]}
	crossed[0].CrossIssuer = fp
	assert.NotEqual(t, ResultsDigest(plain), ResultsDigest(crossed), "a ledger entry of one is never paired with the other")
}
