package main

import (
	"encoding/json"
	"testing"
)

// fuzzSeeds are added to the committed corpus (testdata/fuzz/<Fuzz...>/) in code, so every
// config a test uses is a seed without copying it.
func fuzzSeeds(f *testing.F) {
	for _, s := range []string{exampleYAML, "", "hostname: {", "hostname: [", "a: {b: [1, {c: ", "- - - x",
		"k: |+\n\n", "k: \"\\u12\"", "- k: v\n  - x", "{\"hostname\": 1}", "---\n...\n"} {
		f.Add([]byte(s))
	}
}

// FuzzParseYAML: the parser returns a tree or an error for any input, never panics, and the
// tree it returns is not much larger than the input (no blow-up from hostile documents).
func FuzzParseYAML(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		tree, err := parseYAML("fuzz.yaml", data)
		if err != nil {
			return
		}
		out, err := json.Marshal(tree)
		if err != nil {
			t.Fatalf("the tree does not marshal: %v", err)
		}
		if len(out) > 8*len(data)+64 {
			t.Fatalf("%d bytes of YAML gave %d bytes of JSON", len(data), len(out))
		}
	})
}

// FuzzParseConfig: a config decodes and validates or is an error, never a panic; what
// decodes survives a round trip through JSON (what persistConfig keeps on STATE).
func FuzzParseConfig(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseConfig("fuzz.yaml", data, false)
		cfg, err := parseConfig("fuzz.yaml", data, true)
		if err != nil {
			return
		}
		kept, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("a valid config does not marshal: %v", err)
		}
		if _, err := parseConfig("config.json", kept, true); err != nil {
			t.Fatalf("a valid config is refused once kept: %v\n%s", err, kept)
		}
	})
}
