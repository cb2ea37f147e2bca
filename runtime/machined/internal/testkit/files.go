package testkit

import (
	"os"
	"path/filepath"
	"testing"
)

// WriteFile writes content to path, making its directories: a fake /sys or /proc tree.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
