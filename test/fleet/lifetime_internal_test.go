package fleet

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestLostReasonsCountsEveryWayAnAgentIsLost: the lifetime scenario's
// definition of a lost agent, case by case; a failover within the bound
// is not one.
func TestLostReasonsCountsEveryWayAnAgentIsLost(t *testing.T) {
	fine := AgentState{Cluster: "a", Connected: true}
	for _, tc := range []struct {
		name string
		st   AgentState
		gap  time.Duration
		want []string
	}{
		{"connected, failed over within the bound", fine, 3 * time.Second, nil},
		{"connected, never without a session", fine, 0, nil},
		{"session refused", AgentState{Refused: status.Error(codes.PermissionDenied, "refused"), Connected: false},
			0, []string{"session refused (PermissionDenied)", "no session at the end (last error <nil>)"}},
		{"asked for a token", AgentState{Connected: true, TokenAsks: 2, LastCredentialError: "no bootstrap token"},
			0, []string{"asked for a bootstrap token 2 times (no bootstrap token)"}},
		{"no session at the end", AgentState{LastError: errors.New("x509: certificate signed by unknown authority")},
			time.Second, []string{"no session at the end (last error x509: certificate signed by unknown authority)"}},
		{"a gap over the bound", fine, 61 * time.Second, []string{"1m1s without a session"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, lostReasons(tc.st, tc.gap, time.Minute))
		})
	}
}
