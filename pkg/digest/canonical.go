package digest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxJSONDepth bounds the nesting ParseJSON and Canonical accept.
const MaxJSONDepth = 64

// ErrDuplicateKey is returned by ParseJSON for an object with a repeated key.
var ErrDuplicateKey = errors.New("duplicate object key")

// Canonical renders v as canonical JSON: object keys sorted recursively in
// ascending UTF-16 code-unit order (JavaScript's default sort, which equals
// byte order for keys of the Basic Multilingual Plane below U+E000), arrays in
// order, no whitespace, strings escaped as JSON.stringify does (only '"', '\\'
// and control characters; control characters other than \b \f \n \r \t as
// \u00xx), numbers formatted as JavaScript does (shortest round-trip, exponent
// form below 1e-6 and from 1e21, -0 as 0).
//
// v may be the result of ParseJSON (map[string]any, []any, string,
// json.Number, bool, nil), any Go number, or any value encoding/json can
// marshal (it is marshalled and re-parsed first). Non-finite numbers are
// refused.
func Canonical(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := writeCanonical(&b, v, 0); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// CanonicalHash returns "sha256:" + hex(sha256(Canonical(v))).
func CanonicalHash(v any) (string, error) {
	b, err := Canonical(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return Prefix + hex.EncodeToString(sum[:]), nil
}

// ParseJSON decodes exactly one JSON value strictly: numbers stay
// json.Number, an object with a repeated key is refused (ErrDuplicateKey),
// nesting deeper than MaxJSONDepth is refused, and nothing but whitespace may
// follow the value.
func ParseJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after JSON value")
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return parseFrom(dec, tok, depth)
}

func parseFrom(dec *json.Decoder, tok json.Token, depth int) (any, error) {
	switch t := tok.(type) {
	case json.Delim:
		if depth >= MaxJSONDepth {
			return nil, fmt.Errorf("JSON nested deeper than %d", MaxJSONDepth)
		}
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, errors.New("object key is not a string")
				}
				if _, dup := obj[k]; dup {
					return nil, fmt.Errorf("%w %q", ErrDuplicateKey, k)
				}
				v, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				obj[k] = v
			}
			if _, err := dec.Token(); err != nil { // '}'
				return nil, err
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil { // ']'
				return nil, err
			}
			return arr, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil // string, json.Number, bool, nil
	}
}

func writeCanonical(b *bytes.Buffer, v any, depth int) error {
	if depth > MaxJSONDepth {
		return fmt.Errorf("JSON nested deeper than %d", MaxJSONDepth)
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if t {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		writeString(b, t)
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return fmt.Errorf("number %q: %w", t, err)
		}
		return writeNumber(b, f)
	case float64:
		return writeNumber(b, t)
	case float32:
		return writeNumber(b, float64(t))
	case int:
		return writeNumber(b, float64(t))
	case int32:
		return writeNumber(b, float64(t))
	case int64:
		return writeNumber(b, float64(t))
	case uint32:
		return writeNumber(b, float64(t))
	case uint64:
		return writeNumber(b, float64(t))
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareUTF16)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, t[k], depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case map[string]string:
		m := make(map[string]any, len(t))
		for k, s := range t {
			m[k] = s
		}
		return writeCanonical(b, m, depth)
	case []any:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case []string:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, e)
		}
		b.WriteByte(']')
	case json.RawMessage:
		p, err := ParseJSON(t)
		if err != nil {
			return err
		}
		return writeCanonical(b, p, depth)
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		p, err := ParseJSON(raw)
		if err != nil {
			return err
		}
		return writeCanonical(b, p, depth)
	}
	return nil
}

// writeNumber formats f as JavaScript's Number.prototype.toString does for
// finite values (which is what encoding/json does for float64, except -0).
func writeNumber(b *bytes.Buffer, f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return errors.New("non-finite number")
	}
	if f == 0 {
		b.WriteByte('0')
		return nil
	}
	raw, err := json.Marshal(f)
	if err != nil {
		return err
	}
	b.Write(raw)
	return nil
}

const hexDigits = "0123456789abcdef"

// writeString escapes s as JSON.stringify does. Invalid UTF-8 bytes become
// U+FFFD (a JavaScript string cannot hold them).
func writeString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"':
				b.WriteString(`\"`)
			case c == '\\':
				b.WriteString(`\\`)
			case c == '\b':
				b.WriteString(`\b`)
			case c == '\f':
				b.WriteString(`\f`)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c == '\t':
				b.WriteString(`\t`)
			case c < 0x20:
				b.WriteString(`\u00`)
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&0xf])
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString("\ufffd")
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}

// compareUTF16 orders strings by UTF-16 code units, as JavaScript's default
// Array.prototype.sort does.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := firstUnit(ra), firstUnit(rb)
			if ua != ub {
				if ua < ub {
					return -1
				}
				return 1
			}
			// Same high surrogate: compare the low ones.
			_, la := utf16.EncodeRune(ra)
			_, lb := utf16.EncodeRune(rb)
			if la < lb {
				return -1
			}
			return 1
		}
		a, b = a[na:], b[nb:]
	}
	switch {
	case a == "" && b == "":
		return 0
	case a == "":
		return -1
	}
	return 1
}

func firstUnit(r rune) rune {
	if r >= 0x10000 {
		hi, _ := utf16.EncodeRune(r)
		return hi
	}
	return r
}
