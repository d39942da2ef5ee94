package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonicalJSON(t *testing.T) {
	cases := []struct {
		in   string
		want string
	}{
		{`{"b":1,"a":[3,{"d":true,"c":null}],"A":"x"}`, `{"A":"x","a":[3,{"c":null,"d":true}],"b":1}`},
		{` [ 1.0 , 1e21 , 1e-7 , 0.000001 , -0 , 123456789012 , 1.5e300 ] `, `[1,1e+21,1e-7,0.000001,0,123456789012,1.5e+300]`},
		{`"a\"b\\c\n\t\u0001\u001f<>&\u2028é"`, "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f<>&\u2028é\""},
		{`{"\ud83d\ude00":1,"\uffff":2,"z":3}`, "{\"z\":3,\"\U0001F600\":1,\"\uffff\":2}"},
		{`{}`, `{}`},
		{`[]`, `[]`},
	}
	for _, c := range cases {
		v, err := ParseJSON([]byte(c.in))
		require.NoError(t, err, c.in)
		got, err := Canonical(v)
		require.NoError(t, err)
		require.Equal(t, c.want, string(got), c.in)
	}
}

func TestCanonicalHashOfStructsAndMaps(t *testing.T) {
	type inner struct {
		Z string `json:"z"`
		A int    `json:"a"`
	}
	v := map[string]any{"pins": inner{Z: "1.18.17", A: 2}, "list": []string{"b", "a"}}
	got, err := CanonicalHash(v)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(`{"list":["b","a"],"pins":{"a":2,"z":"1.18.17"}}`))
	require.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), got)
}

func TestParseJSONStrict(t *testing.T) {
	for _, bad := range []string{
		`{"a":1,"a":2}`, `{"a":1} x`, `{"a":`, ``, `[1,]`, `{"a" 1}`, `nul`,
		string(make([]byte, 0)) + `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
	} {
		_, err := ParseJSON([]byte(bad))
		require.Error(t, err, bad)
	}
	_, err := ParseJSON([]byte(`{"a":1,"a":2}`))
	require.ErrorIs(t, err, ErrDuplicateKey)
	v, err := ParseJSON([]byte(` {"n": 12345678901234567890} `))
	require.NoError(t, err)
	require.Equal(t, json.Number("12345678901234567890"), v.(map[string]any)["n"])
	_, err = Canonical(json.Number("1e999"))
	require.Error(t, err)
}
