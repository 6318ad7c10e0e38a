package accessaudit_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/require"
)

// FuzzAudit audits whatever input decodes: it must not panic, must be
// deterministic, and every output form must be written.
func FuzzAudit(f *testing.F) {
	inputs, err := filepath.Glob("testdata/*/input.yaml")
	require.NoError(f, err)
	for _, path := range inputs {
		b, err := os.ReadFile(path)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := &translation.Input{}
		if in.Decode(b) != nil {
			return
		}
		cfg := withMax(auditConfig(t, admin), 200)
		r, err := accessaudit.Audit(t.Context(), in, cfg)
		if err != nil {
			require.ErrorIs(t, err, accessaudit.ErrTooLarge)
			return
		}
		again, err := accessaudit.Audit(t.Context(), in, cfg)
		require.NoError(t, err)
		var x, y, table, page bytes.Buffer
		require.NoError(t, accessaudit.WriteJSON(&x, r))
		require.NoError(t, accessaudit.WriteJSON(&y, again))
		require.Equal(t, x.String(), y.String())
		require.True(t, json.Valid(x.Bytes()))
		require.NoError(t, accessaudit.WriteTable(&table, r))
		require.NoError(t, accessaudit.WriteHTML(&page, r))
		require.True(t, accessaudit.Compare(r, again).Empty())
	})
}

// FuzzParseRef: a parsed reference prints as something that parses to it.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"accesspolicy/bookinfo/x", "vm/relaymesh/prod", "a/b", "//", "mesh/a/b/c", "workload/ns/w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := accessaudit.ParseRef(s)
		if err != nil {
			return
		}
		again, err := accessaudit.ParseRef(r.String())
		require.NoError(t, err)
		require.Equal(t, r, again)
	})
}
