// Package text holds the string helpers every package bounds untrusted
// input with, once.
package text

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// ellipsis marks a cut string.
const ellipsis = "…"

// Truncate returns s if it is at most n bytes, else its longest prefix that
// ends on a rune boundary and, with "…" appended, fits n bytes. Invalid
// UTF-8 in s is replaced, so the result is always valid UTF-8 (protobuf
// strings and JSON need it). An n too small for the ellipsis (3 bytes)
// gives "".
func Truncate(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	cut := n - len(ellipsis)
	if cut < 0 {
		return ""
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// OneLine bounds untrusted s for one line of a terminal or a table cell:
// every rune that is not printable (line breaks, tabs, terminal escapes,
// bidirectional overrides, invalid UTF-8) becomes a space, then s is cut
// to n bytes as Truncate cuts it.
func OneLine(s string, n int) string {
	return Truncate(strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s), n)
}
