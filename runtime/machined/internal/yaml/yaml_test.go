package yaml

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestYAMLSubset(t *testing.T) {
	doc := `---
pem: |
  -----BEGIN CERTIFICATE-----
  MIIB
    indented
  -----END CERTIFICATE-----
stripped: |-
  one
  two
folded: >
  a
  b

  c
empty_map: {}
flow: {a: 1, b: [x, "y, z"], c: null}
list:
- a
- - nested
  - seq
- k: v
  k2: v2
-
  deep: 1
quoted: "a # not a comment"
plain: value # a comment
url: http://example.com:8080/x
nums: [0, -3, 1.5, .5, 0x10, 0755, 1e3]
bools: [true, false, ~, null]
"quoted key": 1
...
`
	got, err := Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	m := got.(map[string]interface{})
	checks := map[string]interface{}{
		"pem":      "-----BEGIN CERTIFICATE-----\nMIIB\n  indented\n-----END CERTIFICATE-----\n",
		"stripped": "one\ntwo",
		"folded":   "a b\nc\n",
		"quoted":   "a # not a comment",
		"plain":    "value",
		"url":      "http://example.com:8080/x",
	}
	for k, want := range checks {
		if m[k] != want {
			t.Errorf("%s = %q, want %q", k, m[k], want)
		}
	}
	str := func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	for k, want := range map[string]string{
		"empty_map":  `{}`,
		"flow":       `{"a":1,"b":["x","y, z"],"c":null}`,
		"list":       `["a",["nested","seq"],{"k":"v","k2":"v2"},{"deep":1}]`,
		"nums":       `[0,-3,1.5,0.5,16,"0755",1000]`,
		"bools":      `[true,false,null,null]`,
		"quoted key": `1`,
	} {
		if got := str(m[k]); got != want {
			t.Errorf("%s = %s, want %s", k, got, want)
		}
	}
}

func TestYAMLErrorsNameTheLine(t *testing.T) {
	for doc, want := range map[string]string{
		"a: 1\n\tb: 2\n":                 "t.yaml:2: tabs",
		"a: 1\na: 2\n":                   "t.yaml:2: duplicate key",
		"a: &anchor 1\n":                 "t.yaml:1: \"&anchor 1\": anchors",
		"a: *ref\n":                      "t.yaml:1:",
		"a: [1, 2\n":                     "t.yaml:1: missing",
		"a: \"open\n":                    "t.yaml:1: unterminated",
		"a:\n  b: 1\n c: 2\n":            "t.yaml:3:",
		"a: 1\n---\nb: 2\n":              "t.yaml:2: multiple documents",
		"list:\n  - a\n  b: 1\n":         "t.yaml:3: unexpected indentation",
		"a: !!str 1\n":                   "t.yaml:1:",
		"hostname: {":                    "t.yaml:1: unexpected end of line",
		"a: [x, {":                       "t.yaml:1: unexpected end of line",
		"a: " + strings.Repeat("[", 200): "t.yaml:1: nested more than 64",
		strings.Repeat("- ", 200) + "x":  "t.yaml:1: nested more than 64",
	} {
		_, err := Parse("t.yaml", []byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", doc, err, want)
		}
	}
}
