package fastjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// virtualService is an Istio VirtualService as the dynamic client hands it
// over: integers as int64, other numbers as float64.
func virtualService() map[string]any {
	return map[string]any{
		"apiVersion": "networking.istio.io/v1",
		"kind":       "VirtualService",
		"metadata": map[string]any{
			"name":       "reviews-c1",
			"namespace":  "bookinfo",
			"generation": int64(7),
			"annotations": map[string]any{
				"relaymesh.io/parents": "TrafficPolicy/default/p1",
			},
		},
		"spec": map[string]any{
			"hosts": []any{"reviews.bookinfo.svc.cluster.local"},
			"http": []any{map[string]any{
				"name":  "route-0",
				"match": []any{map[string]any{"sourceLabels": map[string]any{"app": "x"}}},
				"route": []any{
					map[string]any{
						"destination": map[string]any{"host": "reviews.bookinfo.svc.cluster.local", "subset": "v1"},
						"weight":      int64(80),
					},
					map[string]any{
						"destination": map[string]any{"host": "reviews.bookinfo.svc.cluster.local", "subset": "v2"},
						"weight":      int64(20),
					},
				},
				"timeout": "5s",
				"retries": map[string]any{"attempts": int64(3), "perTryTimeout": "2s"},
				"fault": map[string]any{
					"delay": map[string]any{"percentage": map[string]any{"value": 0.5}, "fixedDelay": "7s"},
				},
			}},
		},
	}
}

// hostileStrings are strings whose escaping encoding/json treats specially.
func hostileStrings() map[string]string {
	var ascii, all strings.Builder
	for b := range 0x80 {
		ascii.WriteByte(byte(b))
	}
	for b := range 0x100 {
		all.WriteByte(byte(b))
	}
	strs := map[string]string{
		"empty":                  "",
		"ascii":                  ascii.String(),
		"every byte":             all.String(),
		"html":                   `<script>alert("x&y")</script>`,
		"quote and backslash":    `a"b\c\\"`,
		"line separators":        "a\u2028b\u2029c",
		"near separators":        "\u2027\u202a\u2020\u202f",
		"lone continuation":      "\x80",
		"overlong slash":         "\xc0\xaf",
		"surrogate half":         "\xed\xa0\x80",
		"truncated separator":    "a\xe2\x80",
		"beyond U+10FFFF":        "\xf4\x90\x80\x80",
		"0xff":                   "\xff\xfe",
		"replacement char":       "\ufffd",
		"four-byte rune":         "😀 𝄞",
		"invalid then separator": "\xff\u2028\xff",
		"DEL":                    "\x7f",
	}
	for b := range 0x20 {
		strs[fmt.Sprintf("control %#02x", b)] = fmt.Sprintf("a%cb", b)
	}
	return strs
}

// cycle is a map that contains itself; encoding/json reports an error for it.
func cycle() map[string]any {
	m := map[string]any{}
	m["self"] = m
	return m
}

// nest wraps leaf in depth levels of wrap.
func nest(depth int, leaf any, wrap func(any) any) any {
	v := leaf
	for range depth {
		v = wrap(v)
	}
	return v
}

func inSlice(v any) any { return []any{v} }
func inMap(v any) any   { return map[string]any{"k": v} }

type marshaler struct{}

func (marshaler) MarshalJSON() ([]byte, error) { return nil, errors.New("refused") }

type name string

func TestMarshalMatchesEncodingJSON(t *testing.T) {
	one := 1
	tests := map[string]any{
		"virtual service": virtualService(),

		"nil":                     nil,
		"nil []any":               []any(nil),
		"empty []any":             []any{},
		"nil map":                 map[string]any(nil),
		"empty map":               map[string]any{},
		"nil []string":            []string(nil),
		"empty []string":          []string{},
		"nil map[string]string":   map[string]string(nil),
		"empty map[string]string": map[string]string{},
		"nil []map":               []map[string]any(nil),
		"maps in []map":           []map[string]any{nil, {}, {"a": nil}},
		"nested empties": map[string]any{
			"a": []any{}, "b": map[string]any{}, "c": []any{[]any{}, map[string]any{}, nil},
			"d": []any(nil), "e": map[string]any(nil), "f": []string{}, "g": map[string]string(nil),
		},
		"key order": map[string]any{
			"b": 1, "a": 2, "B": 3, "A": 4, "aa": 5, "a\x00": 6, "": 7, "é": 8, "z": 9, "~": 10, "\xff": 11,
		},
		"bools": []any{true, false},

		"float64": []any{
			0.0, math.Copysign(0, -1), 1.0, -1.0, 0.1, 1.5, -2.75, 100.0, 1e20, 1e21, -1e21, 1e21 - 65536,
			1e-6, 1e-7, -1e-7, 9.999999e-7, 1e-9, 1e-10, 1.2e-100, 123456789.0, 1<<53 + 1,
			math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 5e-324, 1e308, 2.5e-5,
		},
		"float32": []any{
			float32(0), float32(math.Copysign(0, -1)), float32(0.1), float32(1.5), float32(-3.3),
			float32(1e20), float32(1e21), float32(9.99999e20), float32(1e-6), float32(1e-7), float32(9.9999e-7),
			float32(math.MaxFloat32), float32(-math.MaxFloat32), float32(math.SmallestNonzeroFloat32),
			float32(16777217), float32(1e-9), float32(3.4e38),
		},
		"ints": []any{
			0, -1, math.MaxInt, math.MinInt,
			int8(math.MaxInt8), int8(math.MinInt8), int16(math.MaxInt16), int16(math.MinInt16),
			int32(math.MaxInt32), int32(math.MinInt32), int64(math.MaxInt64), int64(math.MinInt64),
			uint(math.MaxUint), uint8(math.MaxUint8), uint16(math.MaxUint16), uint32(math.MaxUint32),
			uint64(math.MaxUint64), uint64(0),
		},
		"numbers": []any{
			json.Number(""), json.Number("0"), json.Number("-0"), json.Number("12"), json.Number("-1.5e+10"),
			json.Number("1E-7"), json.Number("0.25"), json.Number("123456789012345678901234567890"),
		},

		"10000 nested slices":          nest(10000, nil, inSlice),
		"10000 nested maps":            nest(10000, "leaf", inMap),
		"10000 nested empty slices":    nest(10000, []any{}, inSlice),
		"1000 nested maps":             nest(1000, 1.5, inMap),
		"999 nested maps":              nest(999, 1.5, inMap),
		"1001 nested slices":           nest(1001, []string{"x"}, inSlice),
		"deep NaN":                     nest(10000, math.NaN(), inSlice),
		"map cycle":                    cycle(),
		"map cycle under a slice":      []any{"x", cycle()},
		"NaN":                          math.NaN(),
		"+Inf":                         math.Inf(1),
		"-Inf":                         math.Inf(-1),
		"float32 NaN":                  float32(math.NaN()),
		"float32 +Inf in a map":        map[string]any{"a": 1, "b": float32(math.Inf(1))},
		"NaN after other keys":         map[string]any{"a": "x", "b": []any{1, 2, math.NaN()}},
		"invalid number":               json.Number("01"),
		"invalid numbers in a map":     map[string]any{"a": json.Number("1."), "b": json.Number("+1")},
		"number with space":            json.Number(" 1"),
		"number that is a word":        json.Number("NaN"),
		"hex number":                   json.Number("0x10"),
		"dangling exponent":            json.Number("1e"),
		"dangling exponent sign":       json.Number("1e+"),
		"struct":                       struct{ A int }{1},
		"struct in a map":              map[string]any{"a": struct{ B string }{"<b>"}},
		"pointer":                      &one,
		"nil pointer":                  (*int)(nil),
		"typed map":                    map[string]int{"a": 1},
		"int keys":                     map[int]any{2: "b", 1: "a"},
		"bytes":                        []byte("<bytes>"),
		"nil bytes":                    []byte(nil),
		"raw message":                  json.RawMessage(`{"a": 1}`),
		"time":                         time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC),
		"named string":                 name("<n>"),
		"failing marshaler":            map[string]any{"a": marshaler{}},
		"channel":                      make(chan int),
		"func in a slice":              []any{func() {}},
		"nil []int":                    []int(nil),
		"map[string]string with HTML":  map[string]string{"<k>": "&v"},
		"[]string with separators":     []string{"\u2028", "\u2029", "\xff"},
		"[]map with unsupported value": []map[string]any{{"a": uintptr(1)}},
	}
	for k, s := range hostileStrings() {
		tests["string "+k] = s
		tests["key "+k] = map[string]any{s: s}
		tests["map[string]string "+k] = map[string]string{s: s, "x" + s: "y"}
	}
	for name, v := range tests {
		t.Run(name, func(t *testing.T) {
			if err := compareWithEncodingJSON(v); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFastPathCoversUnstructuredValues guards the reason the package exists:
// the values unstructured objects hold never take the slow path.
func TestFastPathCoversUnstructuredValues(t *testing.T) {
	var tests []any
	for _, s := range hostileStrings() {
		tests = append(tests, s, map[string]any{s: []string{s}}, map[string]string{s: s})
	}
	tests = append(tests,
		virtualService(),
		nest(maxDepth, 1.5, inMap),
		[]any{nil, true, 1, int8(1), int16(1), int32(1), int64(1), uint(1), uint8(1), uint16(1), uint32(1),
			uint64(1), float32(1.5), 1.5, json.Number("1.5"), []map[string]any{{"a": "b"}}},
	)
	for i, v := range tests {
		e := new(encoder)
		if !e.value(v) {
			t.Errorf("value %d (%T) fell back to encoding/json", i, v)
		}
	}
}

func TestMarshalIsSafeForConcurrentUse(t *testing.T) {
	want, err := json.Marshal(virtualService())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				got, err := Marshal(virtualService())
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("Marshal = %s, %v; want %s", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A result is the caller's: the next Marshal, which reuses the pooled
// buffer, does not change it.
func TestAResultOutlivesTheNextMarshal(t *testing.T) {
	first, err := Marshal(map[string]any{"a": "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Marshal(map[string]any{"b": "the second, and longer"}); err != nil {
		t.Fatal(err)
	}
	if string(first) != `{"a":"first"}` {
		t.Fatalf("the first result became %s", first)
	}
}

func FuzzMarshalMatchesEncodingJSON(f *testing.F) {
	vs, err := json.Marshal(virtualService())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(vs)
	for _, s := range hostileStrings() {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`null`, `[]`, `{}`, `[1e21, 1e-7, 1e20, 0.000001, -0, 1.5e300]`, `{"a":{"b":[{"c":"<&>"}]}}`,
		`"\u2028\u0000\ud800"`, `[[[[[[[[[[]]]]]]]]]]`, `12345678901234567890`, `-0.0e-0`, `01`, `1.`, `.5`,
	} {
		f.Add([]byte(s))
	}
	for _, x := range []float64{1e21, 1e-6, 1e-7, 1e20, math.MaxFloat64, math.SmallestNonzeroFloat64} {
		f.Add(binary.LittleEndian.AppendUint64(nil, math.Float64bits(x)))
		f.Add(binary.LittleEndian.AppendUint64(nil, uint64(math.Float32bits(float32(x)))))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for i, v := range valuesFrom(data) {
			if err := compareWithEncodingJSON(v); err != nil {
				t.Fatalf("value %d (%T): %v", i, v, err)
			}
		}
	})
}

// valuesFrom builds values from fuzz input: the input decoded as JSON (with
// float64 and with json.Number numbers), the raw bytes as strings, keys and
// numbers (so invalid UTF-8 and invalid numbers are covered), and each 8 bytes
// read as float64, float32 and integer bits.
func valuesFrom(data []byte) []any {
	s := string(data)
	parts := strings.Split(s, ",")
	vs := []any{
		s,
		json.Number(s),
		parts,
		map[string]any{s: s, "parts": parts, "n": []any{len(s), -len(s)}},
		map[string]string{s: s, "": s},
		[]map[string]any{{s: []any{s, nil, true}}, nil},
	}
	if len(parts) >= 2 {
		vs = append(vs, map[string]any{parts[0]: map[string]any{parts[1]: json.Number(parts[1])}})
	}
	var decoded any
	if json.Unmarshal(data, &decoded) == nil {
		vs = append(vs, decoded, map[string]any{"decoded": decoded, s: decoded})
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var numbers any
	if d.Decode(&numbers) == nil {
		vs = append(vs, numbers)
	}
	for b := data; len(b) >= 8; b = b[8:] {
		bits := binary.LittleEndian.Uint64(b)
		vs = append(vs, math.Float64frombits(bits), math.Float32frombits(uint32(bits)), int64(bits), bits,
			[]any{math.Float64frombits(bits), float32(math.Float64frombits(bits)), int32(bits), uint16(bits)})
	}
	return vs
}

// compareWithEncodingJSON describes how Marshal(v) differs from
// json.Marshal(v), or returns nil. It does not print v, which may be cyclic.
func compareWithEncodingJSON(v any) error {
	want, wantErr := json.Marshal(v)
	got, err := Marshal(v)
	if (err != nil) != (wantErr != nil) {
		return fmt.Errorf("Marshal error = %v; encoding/json error = %v", err, wantErr)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("Marshal\n got %.2000q\nwant %.2000q", got, want)
	}
	return nil
}

func BenchmarkMarshal(b *testing.B) {
	benchmarkMarshal(b, Marshal)
}

func BenchmarkMarshalEncodingJSON(b *testing.B) {
	benchmarkMarshal(b, json.Marshal)
}

func benchmarkMarshal(b *testing.B, marshal func(any) ([]byte, error)) {
	vs := virtualService()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := marshal(vs); err != nil {
			b.Fatal(err)
		}
	}
}
