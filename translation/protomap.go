package translation

import (
	"encoding/base64"
	"math"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// specMap returns what json.Unmarshal of protojson.Marshal(m) gives in a
// map[string]any, without the two encodings in between: at 1,000 clusters a
// policy edit produces 1,000 VirtualServices, and those round trips were
// most of the time Add took (docs/benchmarks.md, "Translation without
// JSON round trips"). ok is false for what it does not walk itself —
// messages that are not proto3 (required fields, MessageSets),
// google.protobuf.Any, Timestamp, FieldMask, extensions, a string or map
// key that is not UTF-8, a Duration or Value protojson refuses — and the
// caller takes the round trip, which also gives protojson's error.
// TestSpecMapIsTheProtojsonRoundTrip and FuzzSpecMapIsTheProtojsonRoundTrip
// hold the two equal.
func specMap(m protoreflect.Message) (map[string]any, bool) {
	v, ok := messageValue(m)
	if !ok {
		return nil, false
	}
	obj, isMap := v.(map[string]any)
	return obj, isMap
}

// messageValue is the JSON value of message m: an object, or a
// well-known type's own form.
func messageValue(m protoreflect.Message) (any, bool) {
	d := m.Descriptor()
	if d.Syntax() != protoreflect.Proto3 {
		return nil, false // proto2 and editions may have required fields protojson checks
	}
	if d.FullName().Parent() == "google.protobuf" {
		return wellKnown(m)
	}
	obj := map[string]any{}
	ok := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.IsExtension() {
			ok = false
			return false
		}
		var val any
		if val, ok = fieldValue(fd, v); ok {
			obj[fd.JSONName()] = val
		}
		return ok
	})
	return obj, ok
}

// fieldValue is the JSON value of field fd holding v.
func fieldValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) (any, bool) {
	switch {
	case fd.IsList():
		l := v.List()
		out := make([]any, l.Len())
		for i := range out {
			var ok bool
			if out[i], ok = singular(fd, l.Get(i)); !ok {
				return nil, false
			}
		}
		return out, true
	case fd.IsMap():
		mv := v.Map()
		out := make(map[string]any, mv.Len())
		ok := true
		mv.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			key := k.String()
			if !utf8.ValidString(key) {
				ok = false // protojson refuses such a key
				return false
			}
			var val any
			if val, ok = singular(fd.MapValue(), v); ok {
				out[key] = val
			}
			return ok
		})
		return out, ok
	}
	return singular(fd, v)
}

// singular is the JSON value of one value of field fd (not a list or map).
func singular(fd protoreflect.FieldDescriptor, v protoreflect.Value) (any, bool) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return v.Bool(), true
	case protoreflect.StringKind:
		s := v.String()
		return s, utf8.ValidString(s)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return float64(v.Int()), true
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return float64(v.Uint()), true
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return strconv.FormatInt(v.Int(), 10), true // protojson writes 64-bit integers as strings
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.FormatUint(v.Uint(), 10), true
	case protoreflect.FloatKind:
		return float(v.Float(), 32), true
	case protoreflect.DoubleKind:
		return float(v.Float(), 64), true
	case protoreflect.BytesKind:
		return base64.StdEncoding.EncodeToString(v.Bytes()), true
	case protoreflect.EnumKind:
		if fd.Enum().FullName() == "google.protobuf.NullValue" {
			return nil, true
		}
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name()), true
		}
		return float64(v.Enum()), true
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return messageValue(v.Message())
	}
	return nil, false
}

// float is what protojson's text of f (bits 32 or 64) decodes to: the
// special values as protojson's strings, a float32 at its own shortest
// decimal.
func float(f float64, bits int) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case bits == 32:
		g, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'g', -1, 32), 64)
		return g
	}
	return f
}

// wellKnown is the JSON form of the google.protobuf types Istio's API
// uses: wrappers, Duration, Struct, Value and ListValue (and Empty, an
// empty object as protojson writes any message without fields).
func wellKnown(m protoreflect.Message) (any, bool) {
	fds := m.Descriptor().Fields()
	switch m.Descriptor().Name() {
	case "BoolValue", "Int32Value", "Int64Value", "UInt32Value", "UInt64Value", "FloatValue", "DoubleValue", "StringValue", "BytesValue":
		fd := fds.ByNumber(1)
		return singular(fd, m.Get(fd))
	case "Duration":
		return duration(m.Get(fds.ByNumber(1)).Int(), m.Get(fds.ByNumber(2)).Int())
	case "Empty":
		return map[string]any{}, true
	case "Struct":
		fd := fds.ByNumber(1)
		return fieldValue(fd, m.Get(fd))
	case "ListValue":
		fd := fds.ByNumber(1)
		return fieldValue(fd, m.Get(fd))
	case "Value":
		fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("kind"))
		if fd == nil {
			return nil, false // protojson refuses a Value of no kind
		}
		if fd.Kind() == protoreflect.DoubleKind {
			if f := m.Get(fd).Float(); math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, false // and a number it cannot write
			}
		}
		return singular(fd, m.Get(fd))
	}
	return nil, false
}

// duration is protojson's text of a Duration: seconds with 0, 3, 6 or 9
// fractional digits and "s"; not ok where protojson refuses one (nanos
// of a whole second or more included).
func duration(secs, nanos int64) (any, bool) {
	const maxSecs = 315576000000 // ±10,000 years, protojson's bound
	if secs < -maxSecs || secs > maxSecs || nanos <= -1e9 || nanos >= 1e9 || (secs > 0 && nanos < 0) || (secs < 0 && nanos > 0) {
		return nil, false
	}
	sign := ""
	if secs < 0 || nanos < 0 {
		sign, secs, nanos = "-", -secs, -nanos
	}
	b := make([]byte, 0, 24)
	b = append(b, sign...)
	b = strconv.AppendInt(b, secs, 10)
	if nanos != 0 {
		frac := strconv.AppendInt(make([]byte, 0, 10), nanos+1e9, 10)[1:] // nine digits
		for len(frac) > 3 && string(frac[len(frac)-3:]) == "000" {
			frac = frac[:len(frac)-3]
		}
		b = append(append(b, '.'), frac...)
	}
	return string(append(b, 's')), true
}
