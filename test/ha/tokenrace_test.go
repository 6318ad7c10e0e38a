package ha_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/ha"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// raceRounds is how many tokens two replicas race on. Each replica takes
// part in two rounds of three and loses about half of them: about
// raceRounds/3 refusals each, within a replica's budget of failures from all
// peers (60 at once).
const raceRounds = 100

// TestTokenRaceAcrossReplicas mints one bootstrap token per round and has
// two clients, each with its own key and source address, present it at the
// same instant to two different replicas. In every round exactly one
// certificate is issued, the other client is refused with the one bootstrap
// denial, and the replicas' audit logs together hold exactly one issuance
// and one token use per token.
func TestTokenRaceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	env := ha.Setup(t, bin, ha.Config{Replicas: 3})
	env.Start(t)
	const cluster = "race-1"
	env.RegisterOnly(t, cluster, 0)
	roots := env.Roots(t)
	wantID := "spiffe://relaymesh.local/cluster/" + cluster + "/agent"

	type outcome struct {
		replica int
		serial  string
		err     error
		took    time.Duration
	}
	tokenIDs := map[string]int{}   // token id -> round
	secrets := map[string]string{} // token id -> secret half; never printed
	winners := map[string]int{}    // serial -> replica
	wins := make([]int, len(env.Replicas))
	var skew []time.Duration
	// Source addresses are reused round-robin once all are made: the loser
	// of a round spends one failure of its address's budget (5) at that
	// replica, and no address loses more than once a round.
	var sources []netip.Addr
	nextSource := func(k int) netip.Addr {
		if len(sources) < ha.MaxClientAddrs {
			a, err := env.Net.ClientAddr()
			require.NoError(t, err)
			sources = append(sources, a)
			return a
		}
		return sources[k%len(sources)]
	}
	started := time.Now()
	for round := range raceRounds {
		token := env.MintToken(t, cluster)
		parsed, err := identity.ParseToken(token)
		require.NoError(t, err)
		tokenIDs[parsed.ID] = round
		secrets[parsed.ID] = token[len(parsed.ID)+1:]
		pair := []int{round % 3, (round + 1) % 3}
		if round%2 == 1 {
			pair[0], pair[1] = pair[1], pair[0]
		}
		clients := make([]*ha.Client, 2)
		for k, ri := range pair {
			src := nextSource(2*round + k)
			dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			clients[k], err = ha.Dial(dctx, ha.ClientConfig{Addr: env.Replicas[ri].RelayAddr, Roots: roots, Source: src})
			cancel()
			require.NoError(t, err, "round %d: dial replica %d", round, ri)
		}
		out := make([]outcome, 2)
		begin := make([]time.Time, 2)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for k := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				begin[k] = time.Now()
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				resp, err := clients[k].Bootstrap(cctx, cluster, token)
				out[k] = outcome{replica: pair[k], err: err, took: time.Since(begin[k])}
				if err == nil {
					assert.Equal(t, wantID, resp.GetSpiffeId())
					leaf, perr := ha.Leaf(resp.GetCertificateChain())
					if assert.NoError(t, perr) {
						out[k].serial = fmt.Sprintf("%x", leaf.SerialNumber)
					}
				}
			}()
		}
		close(gate)
		wg.Wait()
		for _, c := range clients {
			c.Close()
		}
		d := begin[0].Sub(begin[1])
		if d < 0 {
			d = -d
		}
		skew = append(skew, d)

		ok, denied := 0, 0
		for _, o := range out {
			switch {
			case o.err == nil:
				ok++
				wins[o.replica]++
				winners[o.serial] = o.replica
			case status.Code(o.err) == codes.PermissionDenied && strings.Contains(status.Convert(o.err).Message(), "bootstrap denied"):
				denied++
			default:
				t.Errorf("round %d: replica %d answered neither a certificate nor the bootstrap denial: %v", round, o.replica, o.err)
			}
		}
		require.Equal(t, 1, ok, "round %d (replicas %v): certificates issued for one token", round, pair)
		require.Equal(t, 1, denied, "round %d (replicas %v): refusals", round, pair)
	}
	maxSkew := time.Duration(0)
	for _, d := range skew {
		maxSkew = max(maxSkew, d)
	}
	t.Logf("%d rounds in %s: one certificate per token every round; wins per replica %v; start skew between the two calls ≤ %s",
		raceRounds, time.Since(started).Round(time.Millisecond), wins, maxSkew.Round(time.Microsecond))
	assert.Len(t, winners, raceRounds, "distinct certificates")

	// The audit logs of all replicas together: one issuance and one token
	// use per token, one refusal per loser, each where it happened.
	var recs []ha.AuditRecord
	e2e.Eventually(t, 30*time.Second, "every minted token in an audit log", func() (bool, string) {
		recs = env.AuditRecords(t)
		minted := map[string]bool{}
		for _, r := range recs {
			if r.Type == "token.mint" && r.Cluster == cluster {
				minted[r.Details["token_id"]] = true
			}
		}
		missing := 0
		for id := range tokenIDs {
			if !minted[id] {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d mints not recorded", missing, len(tokenIDs))
	})
	issues, failures := 0, 0
	reasons := map[string]int{}
	uses := map[string]int{}
	mints := map[string]int{}
	for _, r := range recs {
		if r.Cluster != cluster {
			continue
		}
		switch {
		case r.Type == "cert.issue":
			issues++
			rep, ok := winners[r.Serial]
			assert.True(t, ok, "audit records issuance of serial %s, which no client received", r.Serial)
			assert.Equal(t, rep, r.Replica, "serial %s recorded by another replica than the one that answered", r.Serial)
		case r.Type == "token.use" && r.Result == "success":
			if _, ours := tokenIDs[r.Details["token_id"]]; ours {
				uses[r.Details["token_id"]]++
			}
		case r.Type == "token.failure":
			failures++
			reasons[r.Reason]++
		case r.Type == "token.mint":
			mints[r.Details["token_id"]]++
		}
	}
	assert.Equal(t, raceRounds, issues, "cert.issue records across all replicas")
	assert.Equal(t, raceRounds, failures, "token.failure records across all replicas (one per loser)")
	// Every loser is refused as already_used: it lost the conditional
	// patch (the race met in the apiserver) or read the record spent; a
	// spent record stays for the retry window, so none is unknown.
	t.Logf("why the losers were refused: %v", reasons)
	assert.Equal(t, map[string]int{identity.ReasonUsed: raceRounds}, reasons)
	assert.Len(t, uses, raceRounds, "tokens with a recorded use")
	for id, n := range uses {
		assert.Equal(t, 1, n, "token %s used %d times", id, n)
	}
	dup, histogram := 0, map[int]int{} // records per token -> tokens
	for id := range tokenIDs {
		histogram[mints[id]]++
		if mints[id] > 1 {
			dup++
		}
	}
	// Every replica watches token Secrets and records each mint it sees
	// before another replica marks it audited: reported, not hidden.
	t.Logf("token.mint records: %d of %d tokens recorded more than once (records per token -> tokens: %v)", dup, len(tokenIDs), histogram)
	checkRetryOnAnotherReplica(t, env, roots, nextSource(2*raceRounds), secrets)
	env.VerifyAudit(t)

	// No token in any log of any replica.
	for _, r := range env.Replicas {
		for _, f := range []string{r.LogPath, r.AuditLog} {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			assert.NotContains(t, string(b), "PRIVATE KEY", f)
			for id, secret := range secrets {
				if strings.Contains(string(b), secret) {
					t.Errorf("%s holds the secret of token %s", f, id) // the id is public
				}
			}
		}
	}
}

// checkRetryOnAnotherReplica: an agent whose answer was lost after replica
// 0 spent its token retries with the same key and reaches replica 1 (agents
// behind a Service land on any replica): replica 1 issues, because the
// spend is in the token's record, not in replica 0's memory; another key
// at replica 2 is refused. The token's secret is added to secrets, for the
// log check.
func checkRetryOnAnotherReplica(t *testing.T, env *ha.Env, roots []byte, src netip.Addr, secrets map[string]string) {
	ctx := context.Background()
	const cluster = "retry-1"
	env.RegisterOnly(t, cluster, 0)
	token := env.MintToken(t, cluster)
	parsed, err := identity.ParseToken(token)
	require.NoError(t, err)
	secrets[parsed.ID] = token[len(parsed.ID)+1:]
	csr, err := ha.NewCSR()
	require.NoError(t, err)
	at := func(replica int, csr []byte) (*relaypb.CertificateResponse, error) {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		c, err := ha.Dial(dctx, ha.ClientConfig{Addr: env.Replicas[replica].RelayAddr, Roots: roots, Source: src})
		require.NoError(t, err)
		defer c.Close()
		return c.BootstrapCSR(dctx, cluster, token, csr)
	}
	first, err := at(0, csr)
	require.NoError(t, err, "replica 0 spends the token")
	again, err := at(1, csr)
	require.NoError(t, err, "the same key's retry at replica 1")
	assert.Equal(t, first.GetSpiffeId(), again.GetSpiffeId())
	other, err := ha.NewCSR()
	require.NoError(t, err)
	_, err = at(2, other)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "another key at replica 2: %v", err)

	e2e.Eventually(t, 30*time.Second, "the retry and the refusal in the audit logs", func() (bool, string) {
		var got []string
		for _, r := range env.AuditRecords(t) {
			if r.Cluster == cluster && (r.Type == "token.use" || r.Type == "token.failure") {
				got = append(got, fmt.Sprintf("%d %s %s", r.Replica, r.Type, r.Reason))
			}
		}
		slices.Sort(got)
		want := []string{"0 token.use ", "1 token.use retry by the key that spent it", "2 token.failure already_used"}
		return slices.Equal(got, want), fmt.Sprintf("%q", got)
	})
}
