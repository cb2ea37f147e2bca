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

// FuzzParseConfig: a config decodes and validates or is an error, never a panic; what
// decodes survives a round trip through JSON (what the config controller and POST /v1/config
// keep on STATE), and can be planned against the defaults as POST /v1/config plans it, either way.
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
		for _, pair := range [][2]*Config{{{}, cfg}, {cfg, {}}} {
			if results, merged := planConfig(pair[0], pair[1], "", nil); len(results) != len(configSections) || merged == nil {
				t.Fatalf("planned %d sections of %d", len(results), len(configSections))
			}
		}
	})
}
