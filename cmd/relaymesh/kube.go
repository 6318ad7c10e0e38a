package main

import (
	"io"
	"log/slog"
	"strings"

	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/relaymesh/relaymesh/internal/text"
)

// newLogger returns the JSON logger of a long-running process at level
// ("debug", "info", "warn", "error") and routes klog (client-go) through it
// (main installed the route); a bad level is a usage error.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	l, err := logging.ParseLevel(level)
	if err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", text.Truncate(level, 40))
	}
	log := logging.New(w, l)
	logging.RouteKlog(log)
	return log, nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
