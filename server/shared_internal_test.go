package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestStoreCutOff(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	const detect = 7 * time.Second
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, tc := range []struct {
		name                  string
		lost, failed, reached time.Time
		want                  bool
	}{
		{"no other replica reaches it: the store is down", at(0), at(20), time.Time{}, false},
		{"another said so before this one could have noticed (stale)", at(0), at(20), at(5), false},
		{"another reaches it, and this one failed since: cut off", at(0), at(20), at(12), true},
		{"another reaches it, this one has not tried since (back-off after the store's return)", at(0), at(12), at(15), false},
		{"reports at the edge of detect do not count", at(0), at(20), at(7), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, storeCutOff(tc.lost, tc.failed, tc.reached, detect))
		})
	}
}
