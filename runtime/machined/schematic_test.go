package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSchematic(t *testing.T) {
	id := strings.Repeat("ab", 32)
	cases := map[string]string{
		`{"id": "` + id + `", "schematic": {"extensions": ["lldpd"]}}`: id,
		`{"id": "` + strings.ToUpper(id) + `"}`:                        "",
		`{"id": "../../etc"}`:                                          "",
		`{"id": 7}`:                                                    "",
		`not json`:                                                     "",
		`{"id": "` + id + `", "pad": "` + strings.Repeat("x", schematicLimit) + `"}`: "",
	}
	dir := t.TempDir()
	for text, want := range cases {
		path := filepath.Join(dir, "schematic.json")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := readSchematic(path); got != want {
			t.Errorf("readSchematic(%.40q) = %q, want %q", text, got, want)
		}
	}
	if got := readSchematic(filepath.Join(dir, "absent.json")); got != "" {
		t.Errorf("an image without a schematic has ID %q", got)
	}
}
