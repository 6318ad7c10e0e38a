package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzTokenRecordOf feeds a token Secret's stored fields — which anyone
// who can write Secrets in the server's namespace controls — to recordOf:
// it never panics, and a record it returns is well formed: a spend it
// reads has a registration within bounds and the key and time it was
// written with, and a record without any spend key is unspent (one with
// only some of them is an error: TestKubeTokenStore).
func FuzzTokenRecordOf(f *testing.F) {
	hash := hex.EncodeToString(make([]byte, sha256.Size))
	f.Add("c1", hash, "2026-12-05T10:00:00Z", "", "", "", false)
	f.Add("c1", hash, "2026-12-05T10:00:00Z", strings.Repeat("ab", 32), "uid-1", "2026-12-05T10:01:00Z", true)
	f.Add("c1", hash, "2026-12-05T10:00:00Z", strings.Repeat("AB", 32), "uid-1", "2026-12-05T10:01:00Z", true)
	f.Add("c1", "zz", "never", "abcd", strings.Repeat("u", 200), "later", true)
	f.Fuzz(func(t *testing.T, cluster, secretHash, expires, spentKey, spentReg, spentAt string, spent bool) {
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: tokenSecretPrefix + "00", UID: "u", ResourceVersion: "1"},
			Type:       TokenSecretType,
			Data:       map[string][]byte{keyCluster: []byte(cluster), keySecretHash: []byte(secretHash), keyExpiresAt: []byte(expires)},
		}
		if spent { // the hash moves with the spend
			delete(sec.Data, keySecretHash)
			sec.Data[keySpentSecretHash] = []byte(secretHash)
			sec.Data[keySpentKey] = []byte(spentKey)
			sec.Data[keySpentRegistration] = []byte(spentReg)
			sec.Data[keySpentAt] = []byte(spentAt)
		}
		rec, err := recordOf(sec, "00")
		if err != nil {
			return
		}
		if hex.EncodeToString(rec.SecretHash[:]) != secretHash {
			t.Fatalf("secret hash %x read from %q", rec.SecretHash, secretHash)
		}
		if !spent {
			if rec.Spent != nil {
				t.Fatalf("a record without a spend read as spent: %+v", rec.Spent)
			}
			return
		}
		if rec.Spent == nil {
			t.Fatal("a record with a spend read as unspent")
		}
		sp := rec.Spent
		if sp.Registration != spentReg || sp.Registration == "" || len(sp.Registration) > MaxRegistrationLen {
			t.Fatalf("registration %q read from %q", sp.Registration, spentReg)
		}
		if hex.EncodeToString(sp.Key[:]) != spentKey {
			t.Fatalf("key %x read from %q", sp.Key, spentKey)
		}
		if want, err := time.Parse(time.RFC3339, spentAt); err != nil || !want.Equal(sp.At) {
			t.Fatalf("spent at %v read from %q", sp.At, spentAt)
		}
	})
}
