package snapshots

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/prometheus/client_golang/prometheus"
)

// RequestsCounter exposes a store's request counter to the tests.
func RequestsCounter(s *Store) *prometheus.CounterVec { return s.requests }

// Seal exposes seal to the tests: r sealed with key in the current format.
func Seal(key []byte, r Record) ([]byte, error) { return seal(key, r) }

// SealV1 seals r in the first format (no sequence), as replicas of the
// previous release wrote it.
func SealV1(key []byte, r Record) ([]byte, error) {
	v2, err := seal(key, r)
	if err != nil {
		return nil, err
	}
	body := v2[len(recordMagic)+sha256.Size+8:] // without the sequence
	out := append([]byte{}, recordMagicV1...)
	out = append(out, mac(key, macLabelV1, body)...)
	return append(out, body...), nil
}

// sequenceOf reads the sequence of a sealed record of the current format.
func sequenceOf(rec []byte) uint64 {
	return binary.BigEndian.Uint64(rec[len(recordMagic)+sha256.Size:])
}
