// Package fastjson encodes the values unstructured Kubernetes objects are made
// of (map[string]any trees of strings, numbers, booleans and slices) without
// reflection.
//
// Its output MUST equal encoding/json.Marshal's byte for byte, HTML escaping
// included: the translation controller digests the encoded outputs and
// compares the digests across versions. It exists because a translation
// encodes about a thousand objects and encoding/json spends most of its time
// on reflection (BenchmarkMarshal against BenchmarkMarshalEncodingJSON;
// docs/benchmarks.md, "Translation without JSON round trips"). Any value it
// does not know, and any value encoding/json would reject, is handed to
// encoding/json whole, so unusual input costs time but never changes the
// result.
package fastjson

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// Marshal returns what encoding/json.Marshal(v) returns, bytes and error.
// Values made only of nil, bool, string, json.Number, the built-in integer
// and float types, map[string]any, map[string]string, []any, []string and
// []map[string]any are encoded directly; anything else goes to encoding/json.
func Marshal(v any) ([]byte, error) {
	e, ok := encoders.Get().(*encoder)
	if !ok {
		e = new(encoder)
	}
	defer e.release()
	if !e.value(v) {
		return json.Marshal(v)
	}
	return slices.Clone(e.buf), nil
}

// maxDepth is how many maps and slices may nest before the value is handed to
// encoding/json. Past the same depth encoding/json starts looking for cycles
// (startDetectingCyclesAfter); handing over keeps its error for a cyclic
// value and spares us a copy of that check.
const maxDepth = 1000

// maxPooledBuffer bounds the buffers kept for reuse, so that one huge object
// does not pin its memory for the life of the process.
const maxPooledBuffer = 1 << 20

var encoders = sync.Pool{New: func() any { return new(encoder) }}

type encoder struct {
	buf []byte
	// keys is scratch space for sorting map keys, used as a stack: each map
	// appends its keys after its parents' and truncates them when done.
	keys  []string
	depth int
}

func (e *encoder) release() {
	if cap(e.buf) > maxPooledBuffer {
		return
	}
	clear(e.keys[:cap(e.keys)]) // drop references to the caller's strings
	e.buf, e.keys, e.depth = e.buf[:0], e.keys[:0], 0
	encoders.Put(e)
}

// value appends the encoding of v to e.buf and reports whether it could;
// false means only encoding/json knows how to encode v, or that it would
// return an error.
func (e *encoder) value(v any) bool {
	switch v := v.(type) {
	case nil:
		e.buf = append(e.buf, "null"...)
	case string:
		e.buf = appendString(e.buf, v)
	case bool:
		e.buf = strconv.AppendBool(e.buf, v)
	case float64:
		return e.float(v, 64)
	case float32:
		return e.float(float64(v), 32)
	case int:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int8:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int16:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int32:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int64:
		e.buf = strconv.AppendInt(e.buf, v, 10)
	case uint:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case uint8:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case uint16:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case uint32:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case uint64:
		e.buf = strconv.AppendUint(e.buf, v, 10)
	case json.Number:
		return e.number(v)
	case map[string]any:
		return object(e, v, (*encoder).value)
	case map[string]string:
		return object(e, v, (*encoder).string)
	case []any:
		return array(e, v, (*encoder).value)
	case []string:
		return array(e, v, (*encoder).string)
	case []map[string]any:
		return array(e, v, func(e *encoder, m map[string]any) bool {
			return object(e, m, (*encoder).value)
		})
	default:
		return false
	}
	return true
}

func (e *encoder) string(s string) bool {
	e.buf = appendString(e.buf, s)
	return true
}

// object appends m with its keys in byte-wise order, as encoding/json does.
func object[V any](e *encoder, m map[string]V, elem func(*encoder, V) bool) bool {
	if m == nil {
		e.buf = append(e.buf, "null"...)
		return true
	}
	if e.depth++; e.depth > maxDepth {
		return false
	}
	start := len(e.keys)
	for k := range m {
		e.keys = append(e.keys, k)
	}
	keys := e.keys[start:]
	slices.Sort(keys)
	e.buf = append(e.buf, '{')
	for i, k := range keys {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.buf = appendString(e.buf, k)
		e.buf = append(e.buf, ':')
		if !elem(e, m[k]) {
			return false
		}
	}
	e.buf = append(e.buf, '}')
	e.keys = e.keys[:start]
	e.depth--
	return true
}

func array[T any](e *encoder, s []T, elem func(*encoder, T) bool) bool {
	if s == nil {
		e.buf = append(e.buf, "null"...)
		return true
	}
	if e.depth++; e.depth > maxDepth {
		return false
	}
	e.buf = append(e.buf, '[')
	for i, v := range s {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if !elem(e, v) {
			return false
		}
	}
	e.buf = append(e.buf, ']')
	e.depth--
	return true
}

// float follows encoding/json's floatEncoder: ES6 number formatting, with
// the exponent cut-offs compared at the value's own precision. NaN and the
// infinities are left to encoding/json, which rejects them.
func (e *encoder) float(f float64, bits int) bool {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) ||
			bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	start := len(e.buf)
	e.buf = strconv.AppendFloat(e.buf, f, format, -1, bits)
	if format == 'e' {
		// Clean up e-09 to e-9.
		b := e.buf[start:]
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			e.buf = e.buf[:len(e.buf)-1]
		}
	}
	return true
}

// number appends n as written, the empty Number as 0, and leaves one that is
// not a JSON number to encoding/json, which rejects it.
func (e *encoder) number(n json.Number) bool {
	s := string(n)
	if s == "" {
		s = "0"
	}
	if !isValidNumber(s) {
		return false
	}
	e.buf = append(e.buf, s...)
	return true
}

// isValidNumber reports whether s is a number in the JSON grammar (RFC 8259,
// section 6). It is encoding/json's function of the same name.
func isValidNumber(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '-' {
		s = s[1:]
		if s == "" {
			return false
		}
	}
	// Integer part: 0, or a digit 1-9 followed by digits.
	switch {
	case s[0] == '0':
		s = s[1:]
	case '1' <= s[0] && s[0] <= '9':
		s = skipDigits(s[1:])
	default:
		return false
	}
	// Fraction: '.' followed by one or more digits.
	if len(s) >= 2 && s[0] == '.' && isDigit(s[1]) {
		s = skipDigits(s[2:])
	}
	// Exponent: 'e' or 'E', an optional sign, then digits.
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		if s[0] == '+' || s[0] == '-' {
			s = s[1:]
			if s == "" {
				return false
			}
		}
		s = skipDigits(s)
	}
	return s == ""
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

func skipDigits(s string) string {
	for len(s) > 0 && isDigit(s[0]) {
		s = s[1:]
	}
	return s
}

// htmlSafe[b] reports whether the ASCII byte b appears in an encoded string
// as itself: not a control character, '"', '\\', '<', '>' or '&'.
var htmlSafe = func() (safe [utf8.RuneSelf]bool) {
	for b := ' '; b < utf8.RuneSelf; b++ {
		safe[b] = true
	}
	for _, b := range `"\<>&` {
		safe[b] = false
	}
	return safe
}()

const hex = "0123456789abcdef"

// appendString appends s quoted as encoding/json quotes it with HTML
// escaping on: short escapes for \b \f \n \r \t \" and \\, \u00XX for the
// other control characters and for < > &, \u2028 and \u2029 for the line and
// paragraph separators, and \ufffd for each byte of invalid UTF-8.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending: it needs no escaping
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if htmlSafe[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
