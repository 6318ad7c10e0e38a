package app

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The agent without flags is a valid configuration (the cluster and the
// server come from the ConfigMap).
func TestDefaultIsValid(t *testing.T) {
	require.NoError(t, Default().Validate())
	off := Default()
	off.LeaderElect, off.RetryPeriod = false, 0
	assert.NoError(t, off.Validate(), "the election's timings do not matter without it")
}

// Every bad field is reported, each with the flag that sets it.
func TestValidateNamesTheFlagOfEveryBadField(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Config)
		want []string
	}{
		"retry over renew":            {func(c *Config) { c.RetryPeriod = 20 * time.Second }, []string{"0 < --leader-retry-period < --leader-renew-deadline < --leader-lease-duration"}},
		"renew over lease":            {func(c *Config) { c.RenewDeadline = time.Minute }, []string{"--leader-renew-deadline"}},
		"no retry period":             {func(c *Config) { c.RetryPeriod = 0 }, []string{"--leader-retry-period"}},
		"bad log level":               {func(c *Config) { c.LogLevel = "loud" }, []string{`--log-level "loud"`}},
		"huge log level":              {func(c *Config) { c.LogLevel = string(make([]byte, 1<<16)) }, []string{"--log-level"}},
		"no namespace":                {func(c *Config) { c.Namespace = "" }, []string{"--namespace"}},
		"no lease name":               {func(c *Config) { c.LeaseName = "" }, []string{"--lease-name"}},
		"failover without federation": {func(c *Config) { c.AmbientFailover = true }, []string{"--ambient-failover needs --ambient-federation"}},
		"two bad, both named":         {func(c *Config) { c.LogLevel, c.LeaseName = "x", "" }, []string{"--log-level", "--lease-name"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			err := c.Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Less(t, len(err.Error()), 400, "a hostile value is truncated in the error")
		})
	}
}
