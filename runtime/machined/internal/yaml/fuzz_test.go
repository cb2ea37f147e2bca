package yaml

import (
	"encoding/json"
	"testing"
)

// FuzzParseYAML: the parser returns a tree or an error for any input, never panics, and the
// tree it returns is not much larger than the input (no blow-up from hostile documents).
func FuzzParseYAML(f *testing.F) {
	for _, s := range []string{"hostname: x\nservices: [{name: a, command: /bin/a}]\n", "", "hostname: {",
		"hostname: [", "a: {b: [1, {c: ", "- - - x", "k: |+\n\n", "k: \"\\u12\"", "- k: v\n  - x",
		"{\"hostname\": 1}", "---\n...\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tree, err := Parse("fuzz.yaml", data)
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
