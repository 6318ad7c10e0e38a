// Package logging builds the JSON logger of the long-running processes
// (relaymesh server and agent) so that every line is one well-formed record
// a log pipeline can index:
//
//   - a key appears once per line: a component's logger adds its own
//     "component" (or "cluster") to a logger that already carries one, and
//     encoding/json keeps only one of two equal keys, so the line would say
//     different things to different readers. The last value wins: the
//     innermost component names the line;
//   - durations are Go duration strings ("1.5s"), not integer nanoseconds;
//   - what client-go and the other Kubernetes libraries log through klog
//     goes through the same handler (component "klog"), instead of klog's
//     own text lines mixed into the JSON stream.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// KlogComponent is the component attribute of the lines klog hands over.
const KlogComponent = "klog"

// ParseLevel reads "debug", "info", "warn" or "error".
func ParseLevel(level string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return l, nil
}

// New returns a JSON logger at level writing to w: unique keys per line,
// durations as strings.
func New(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(&uniqueKeys{next: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationString})})
}

// klogTarget is the logger klog's lines go to once InstallKlog ran: the
// one RouteKlog named last, else klogFallback.
var (
	klogTarget   atomic.Pointer[slog.Logger]
	klogFallback atomic.Pointer[slog.Logger]
)

// InstallKlog makes klog (client-go, leader election, informers) log
// through the logger RouteKlog names, and until then through a text logger
// on fallback. klog's own setting is process-wide and not safe against
// concurrent logging: call it once, first thing in main, before anything
// logs.
func InstallKlog(fallback io.Writer) {
	klogFallback.Store(slog.New(slog.NewTextHandler(fallback, nil)))
	klog.SetSlogLogger(slog.New(&klogHandler{}))
}

// RouteKlog sends klog's lines to log, with component KlogComponent, from
// now on (once InstallKlog ran; safe to call at any time, from any
// goroutine).
func RouteKlog(log *slog.Logger) {
	klogTarget.Store(log.With("component", KlogComponent))
}

// klogHandler hands each klog record to the target logger of the moment,
// replaying the attributes and groups klog added on the way.
type klogHandler struct {
	ops []func(slog.Handler) slog.Handler
}

func (h *klogHandler) target() slog.Handler {
	l := klogTarget.Load()
	if l == nil {
		l = klogFallback.Load()
	}
	if l == nil {
		return slog.DiscardHandler
	}
	out := l.Handler()
	for _, op := range h.ops {
		out = op(out)
	}
	return out
}

func (h *klogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.target().Enabled(ctx, l)
}

func (h *klogHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.target().Handle(ctx, r)
}

func (h *klogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &klogHandler{ops: append(slices.Clone(h.ops), func(n slog.Handler) slog.Handler { return n.WithAttrs(attrs) })}
}

func (h *klogHandler) WithGroup(name string) slog.Handler {
	return &klogHandler{ops: append(slices.Clone(h.ops), func(n slog.Handler) slog.Handler { return n.WithGroup(name) })}
}

// durationString writes a duration as its string, e.g. "1m30s".
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// uniqueKeys is a slog.Handler that writes each key once per line (per
// group): an attribute added later replaces an earlier one of the same key,
// where the earlier one stood.
type uniqueKeys struct {
	next slog.Handler
	// attrs were added with WithAttrs since the last group opened; they
	// are handed to next only with the record, so a later one can still
	// replace them.
	attrs []slog.Attr
}

func (h *uniqueKeys) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *uniqueKeys) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &uniqueKeys{next: h.next, attrs: merge(slices.Clone(h.attrs), attrs)}
}

// WithGroup hands the attributes so far to next: keys inside the group are
// another namespace, kept unique on their own.
func (h *uniqueKeys) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	next := h.next
	if len(h.attrs) > 0 {
		next = next.WithAttrs(h.attrs)
	}
	return &uniqueKeys{next: next.WithGroup(name)}
}

func (h *uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	if len(h.attrs) == 0 && r.NumAttrs() < 2 {
		return h.next.Handle(ctx, r)
	}
	attrs := slices.Clone(h.attrs)
	var own []slog.Attr
	r.Attrs(func(a slog.Attr) bool {
		own = append(own, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(merge(attrs, own)...)
	return h.next.Handle(ctx, out)
}

// merge appends add to attrs; an attribute whose key attrs already holds
// replaces it in place. Empty-keyed non-group attributes are dropped, as
// slog's handlers drop them.
func merge(attrs, add []slog.Attr) []slog.Attr {
	for _, a := range add {
		if a.Key == "" && a.Value.Kind() != slog.KindGroup {
			continue
		}
		if a.Key != "" {
			if i := slices.IndexFunc(attrs, func(b slog.Attr) bool { return b.Key == a.Key }); i >= 0 {
				attrs[i] = a
				continue
			}
		}
		attrs = append(attrs, a)
	}
	return attrs
}
