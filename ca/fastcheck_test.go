package ca_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

// Issuance skips work it has already done — a request's self-signature
// verified by ParseCSR, the signature a key signer verified as it signed, a
// chain that verified to its roots — but never a check a leaf needs. These
// are the cases where skipping would be wrong.

// A request changed after ParseCSR verified it, even only its parsed public
// key, is verified again and refused.
func TestPossessionIsVerifiedAgainForAChangedRequest(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{})
	a, err := ca.New(ca.Config{Signer: root.Signer(t, time.Now())})
	require.NoError(t, err)
	csr, err := ca.ParseCSR(catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil))
	require.NoError(t, err)
	csr.PublicKey = catest.NewKey(t, catest.ECDSAP256).Public() // not the key that signed it
	_, err = a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.ErrorIs(t, err, ca.ErrInvalidCSR)
	assert.Contains(t, err.Error(), "no proof of possession")

	// The same request, unchanged, issues (its verification was remembered
	// for exactly its bytes and key).
	good, err := ca.ParseCSR(catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil))
	require.NoError(t, err)
	_, err = a.IssueAgent(context.Background(), good, catest.AgentID)
	require.NoError(t, err)
}

// A chain whose intermediate constrains URI names: every leaf is verified
// against the constraint, so an agent ID outside it is refused even though
// the chain itself verifies (and was used for other leaves before).
func TestNameConstrainedChainVerifiesEveryLeaf(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{})
	inter := root.NewIntermediate(t, catest.CAOptions{PermittedURIDomains: []string{"elsewhere.test"}})
	a, err := ca.New(ca.Config{Signer: inter.Signer(t, time.Now())})
	require.NoError(t, err)
	for range 2 {
		csr, err := ca.ParseCSR(catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil))
		require.NoError(t, err)
		_, err = a.IssueAgent(context.Background(), csr, catest.AgentID) // spiffe://relay.test/…
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.Contains(t, err.Error(), "does not verify")
	}
}

// A root whose pathLen is 0 may not have an intermediate below it with
// leaves: x509.Verify of the intermediate alone passes (it does not count
// itself), a leaf's does not — so the shortcut must not be taken.
func TestPathLenCountsTheIssuingCA(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{PathLenZero: true})
	inter := root.NewIntermediate(t, catest.CAOptions{})
	// The chain itself verifies (x509 does not count the intermediate it
	// verifies), so the signer is accepted.
	signer, err := ca.NewKeySigner(inter.Chain(), inter.Key, inter.Roots(), time.Now())
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: signer})
	require.NoError(t, err)
	csr, err := ca.ParseCSR(catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil))
	require.NoError(t, err)
	_, err = a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.ErrorIs(t, err, ca.ErrIssuance)
	assert.Contains(t, err.Error(), "does not verify")
}

// An unconstrained two-level chain issues many leaves; each verifies with
// x509 on its own (what the shortcut stands for).
func TestShortcutLeavesVerify(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{})
	inter := root.NewIntermediate(t, catest.CAOptions{})
	a, err := ca.New(ca.Config{Signer: inter.Signer(t, time.Now())})
	require.NoError(t, err)
	for range 3 {
		csr, err := ca.ParseCSR(catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil))
		require.NoError(t, err)
		iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
		require.NoError(t, err)
		catest.CheckAgentCertificate(t, iss, csr.PublicKey, catest.AgentID)
	}
}
