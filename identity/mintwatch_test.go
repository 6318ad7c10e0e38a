package identity_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mintRecorder keeps the token.mint events it is given.
type mintRecorder struct {
	mu     sync.Mutex
	tokens []string
}

func (r *mintRecorder) Record(e audit.Event) error {
	if e.Type == audit.TokenMint {
		r.mu.Lock()
		r.tokens = append(r.tokens, e.Details["token_id"])
		r.mu.Unlock()
	}
	return nil
}

func (r *mintRecorder) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.tokens...)
}

// The mint audit of the Lease holder reads the token store's watch instead
// of one of its own: each mint is recorded once, the cached records carry
// no managedFields, and a term that ended takes its handler with it, so
// the next term records what was minted in between, once.
func TestMintAuditSharesTheStoresWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, admin, _ := localcluster.Management(t, "relaymesh")
	store, err := identity.NewKubeTokenStore(admin, "relaymesh")
	require.NoError(t, err)
	require.NoError(t, store.WatchCache(ctx))
	minter, err := identity.NewKubeTokenStore(admin, "relaymesh")
	require.NoError(t, err)
	minter.MintedBy = "alice@example.com"
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: minter})
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	_, first, err := tokens.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	rec := &mintRecorder{}
	term, endTerm := context.WithCancel(ctx)
	require.NoError(t, identity.AuditTokenMints(term, store.Records(), admin, "relaymesh", rec, log))
	require.Eventually(t, func() bool { return len(rec.recorded()) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, []string{first.ID}, rec.recorded())
	require.Eventually(t, func() bool {
		sec, err := admin.CoreV1().Secrets("relaymesh").Get(ctx, "relaymesh-bootstrap-token-"+first.ID, metav1.GetOptions{})
		return err == nil && sec.Annotations["relaymesh.io/audited"] == "true"
	}, 10*time.Second, 20*time.Millisecond, "the record is marked audited")
	require.Eventually(t, func() bool {
		for _, obj := range store.Records().GetStore().List() {
			if sec := obj.(*corev1.Secret); sec.Annotations["relaymesh.io/audited"] == "true" {
				return len(sec.ManagedFields) == 0
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the cached records carry no managedFields")

	// The term ends: a mint now is not recorded by its handler...
	endTerm()
	_, second, err := tokens.Mint(ctx, "cluster-2", time.Hour)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, ok, _ := store.Records().GetStore().GetByKey("relaymesh/relaymesh-bootstrap-token-" + second.ID)
		return ok
	}, 10*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, []string{first.ID}, rec.recorded(), "a handler of an ended term records nothing")

	// ...and the next term records it, and not the first again.
	next := &mintRecorder{}
	require.NoError(t, identity.AuditTokenMints(ctx, store.Records(), admin, "relaymesh", next, log))
	require.Eventually(t, func() bool { return len(next.recorded()) == 1 }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, []string{second.ID}, next.recorded())
}
