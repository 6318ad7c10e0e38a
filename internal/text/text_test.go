package text_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/stretchr/testify/assert"
)

func TestTruncate(t *testing.T) {
	assert.Equal(t, "short", text.Truncate("short", 80))
	assert.Equal(t, "abcd…", text.Truncate("abcdefghij", 7))
	// Never splits a rune: "é" is two bytes.
	assert.Equal(t, "abéé", text.Truncate("abéé", 6))
	assert.Equal(t, "ab…", text.Truncate("abéé", 5))
	assert.Equal(t, "ab…", text.Truncate("abéé", 6-1))
	assert.Equal(t, "a…", text.Truncate("aééé", 5), "no half rune")
	assert.Equal(t, "\uFFFDa", text.Truncate("\xffa", 10), "invalid UTF-8 is replaced")
	assert.Equal(t, "", text.Truncate("abc", 0))
}

func FuzzTruncate(f *testing.F) {
	f.Add("hello, world", 5)
	f.Add(strings.Repeat("é", 10), 7)
	f.Add("\xff\xfe", 2)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		out := text.Truncate(s, n)
		if !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 %q", out)
		}
		if len(out) > max(n, len(strings.ToValidUTF8(s, "\uFFFD"))) || (len(strings.ToValidUTF8(s, "\uFFFD")) > n && len(out) > n) {
			t.Fatalf("Truncate(%q, %d) = %q, longer than allowed", s, n, out)
		}
	})
}

func TestOneLineLeavesNothingATerminalObeys(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, é":                "plain text, é",
		"two\nlines\r\ttab":            "two lines  tab",
		"\x1b[31mred\x1b[0m":           " [31mred [0m",
		"bidi \u202eevil\u2028sep":     "bidi  evil sep",
		"bad \xff utf-8":               "bad   utf-8",
		strings.Repeat("x", 40) + "\n": strings.Repeat("x", 29) + "…",
	} {
		assert.Equal(t, want, text.OneLine(in, 32), "%q", in)
	}
}
