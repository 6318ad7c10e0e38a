// Package identitytest holds fakes for tests of packages that use identity:
// an in-memory TokenStore with the same atomicity contract as the
// Kubernetes one, and in-memory AgentSecrets. It is imported only from
// _test.go files.
package identitytest

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"sync"

	"github.com/relaymesh/relaymesh/identity"
)

// MemTokenStore is an in-memory identity.TokenStore.
type MemTokenStore struct {
	mu      sync.Mutex
	recs    map[string]identity.TokenRecord
	lagged  map[string]identity.TokenRecord // what Get serves while lagging
	version int
	// AfterSpend, when set, runs after each successful Spend, before it
	// returns (a slow store or network in tests); set it before the store
	// is shared.
	AfterSpend func()
}

// NewMemTokenStore returns an empty store.
func NewMemTokenStore() *MemTokenStore {
	return &MemTokenStore{recs: map[string]identity.TokenRecord{}}
}

// Create implements identity.TokenStore.
func (m *MemTokenStore) Create(_ context.Context, rec identity.TokenRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[rec.ID]; ok {
		return errors.New("token id exists")
	}
	m.version++
	rec.Version = strconv.Itoa(m.version)
	m.recs[rec.ID] = rec
	return nil
}

// Get implements identity.TokenStore: the store, or while it lags the
// records as they were when Lag was called (a watch cache behind).
func (m *MemTokenStore) Get(_ context.Context, id string) (identity.TokenRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lagged != nil {
		return lookup(m.lagged, id)
	}
	return lookup(m.recs, id)
}

func lookup(recs map[string]identity.TokenRecord, id string) (identity.TokenRecord, error) {
	rec, ok := recs[id]
	if !ok {
		return identity.TokenRecord{}, identity.ErrTokenNotFound
	}
	return rec, nil
}

// GetLatest implements identity.TokenStore: always the store.
func (m *MemTokenStore) GetLatest(_ context.Context, id string) (identity.TokenRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return lookup(m.recs, id)
}

// Lag makes Get serve the records as they are now, as a watch cache that
// stopped seeing changes would, until CatchUp.
func (m *MemTokenStore) Lag() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lagged = maps.Clone(m.recs)
}

// CatchUp ends Lag.
func (m *MemTokenStore) CatchUp() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lagged = nil
}

// Touch gives a record a new version and nothing else, as a metadata
// write (the mint audit's annotation) does.
func (m *MemTokenStore) Touch(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec, ok := m.recs[id]; ok {
		m.version++
		rec.Version = strconv.Itoa(m.version)
		m.recs[id] = rec
	}
}

// Spend implements identity.TokenStore.
func (m *MemTokenStore) Spend(_ context.Context, rec identity.TokenRecord, sp identity.Spend) error {
	if err := sp.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	cur, ok := m.recs[rec.ID]
	switch {
	case !ok:
		m.mu.Unlock()
		return identity.ErrTokenNotFound
	case cur.Version != rec.Version:
		m.mu.Unlock()
		return identity.ErrTokenChanged
	}
	m.version++
	cur.Version = strconv.Itoa(m.version)
	cur.Spent = &sp
	m.recs[rec.ID] = cur
	after := m.AfterSpend
	m.mu.Unlock()
	if after != nil {
		after()
	}
	return nil
}

// Consume implements identity.TokenStore.
func (m *MemTokenStore) Consume(_ context.Context, rec identity.TokenRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[rec.ID]; !ok {
		return identity.ErrTokenNotFound
	}
	delete(m.recs, rec.ID)
	return nil
}

// Unspent is the number of stored records not yet spent.
func (m *MemTokenStore) Unspent() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.recs {
		if r.Spent == nil {
			n++
		}
	}
	return n
}

// DeleteCluster implements identity.TokenStore.
func (m *MemTokenStore) DeleteCluster(_ context.Context, cluster string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.recs {
		if r.Cluster == cluster {
			delete(m.recs, id)
		}
	}
	return nil
}

// MemAgentSecrets is an in-memory identity.AgentSecrets.
type MemAgentSecrets struct {
	mu                             sync.Mutex
	roots, cert, key, savedCA      []byte
	token                          string
	saves, tokenDeletes, failSaves int
	rootSaves                      int
}

// NewMemAgentSecrets holds roots and, if not empty, a bootstrap token.
func NewMemAgentSecrets(roots []byte, token string) *MemAgentSecrets {
	return &MemAgentSecrets{roots: roots, token: token}
}

// Roots implements identity.AgentSecrets.
func (m *MemAgentSecrets) Roots(context.Context) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.roots) == 0 {
		return nil, identity.ErrNoRoots
	}
	return m.roots, nil
}

// Token implements identity.AgentSecrets.
func (m *MemAgentSecrets) Token(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.token == "" {
		return "", identity.ErrNoToken
	}
	return m.token, nil
}

// DeleteToken implements identity.AgentSecrets.
func (m *MemAgentSecrets) DeleteToken(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.token = ""
	m.tokenDeletes++
	return nil
}

// LoadCredential implements identity.AgentSecrets.
func (m *MemAgentSecrets) LoadCredential(context.Context) ([]byte, []byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil {
		return nil, nil, identity.ErrNoCredential
	}
	return m.cert, m.key, nil
}

// FailSaves makes the next n SaveCredential calls fail.
func (m *MemAgentSecrets) FailSaves(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failSaves = n
}

// SaveCredential implements identity.AgentSecrets.
func (m *MemAgentSecrets) SaveCredential(_ context.Context, cert, key, roots []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failSaves > 0 {
		m.failSaves--
		return errors.New("injected store failure")
	}
	m.cert, m.key, m.savedCA = cert, key, roots
	m.saves++
	return nil
}

// SavedRoots are the roots stored with the last credential (the client
// Secret's ca.crt).
func (m *MemAgentSecrets) SavedRoots() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.savedCA
}

// Saves is how often a credential was stored; HasToken whether a token remains.
func (m *MemAgentSecrets) Saves() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.saves
}

// HasToken reports whether the bootstrap token is still there.
func (m *MemAgentSecrets) HasToken() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.token != ""
}

// SetToken replaces the bootstrap token.
func (m *MemAgentSecrets) SetToken(tok string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.token = tok
}

// SaveRoots implements identity.RootsSaver.
func (m *MemAgentSecrets) SaveRoots(_ context.Context, roots []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roots = append([]byte(nil), roots...)
	m.rootSaves++
	return nil
}

// RootSaves counts SaveRoots calls.
func (m *MemAgentSecrets) RootSaves() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rootSaves
}
