package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// drive is a directory laid out as a hostile config drive could be.
func drive(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kiln.yaml", "hostname: a\n")
	write("openstack/latest/meta_data.json", "{}")
	write("big", strings.Repeat("x", 100))
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"zero": "/dev/zero", "escape": outside, "dirlink": filepath.Dir(outside), "rel": "kiln.yaml",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("latest", filepath.Join(root, "openstack", "current")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestReadUnderReadsRegularFiles(t *testing.T) {
	root := drive(t)
	for rel, want := range map[string]string{"kiln.yaml": "hostname: a\n", "openstack/latest/meta_data.json": "{}"} {
		data, err := ReadUnder(root, rel, 1<<20)
		if err != nil || string(data) != want {
			t.Errorf("%s: %q, %v", rel, data, err)
		}
	}
}

func TestReadUnderRefusesWhatIsNotARegularFile(t *testing.T) {
	root := drive(t)
	for _, rel := range []string{"zero", "escape", "rel", "dirlink/secret", "openstack/current/meta_data.json", "fifo", "openstack", "kiln.yaml/x"} {
		done := make(chan error, 1)
		go func() { _, err := ReadUnder(root, rel, 1<<20); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("%s: %v, want ErrNotRegular", rel, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the read hangs", rel)
		}
	}
}

func TestReadUnderBoundsAndPaths(t *testing.T) {
	root := drive(t)
	if _, err := ReadUnder(root, "big", 99); !errors.Is(err, ErrTooLarge) {
		t.Errorf("big: %v, want ErrTooLarge", err)
	}
	if data, err := ReadUnder(root, "big", 100); err != nil || len(data) != 100 {
		t.Errorf("big at its size: %d bytes, %v", len(data), err)
	}
	if _, err := ReadUnder(root, "missing", 10); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v, want ErrNotExist", err)
	}
	if _, err := ReadUnder(root, "openstack/nope/x", 10); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing dir: %v, want ErrNotExist", err)
	}
	for _, rel := range []string{"", "/kiln.yaml", "../kiln.yaml", "a/../kiln.yaml", "./kiln.yaml", ".", "..", "a//b", "a/", "a\x00b"} {
		if _, err := ReadUnder(root, rel, 10); err == nil || errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q: %v, want a refusal", rel, err)
		}
	}
}

func TestReadFile(t *testing.T) {
	root := drive(t)
	if data, err := ReadFile(filepath.Join(root, "kiln.yaml"), 100); err != nil || string(data) != "hostname: a\n" {
		t.Errorf("ReadFile: %q, %v", data, err)
	}
	if _, err := ReadFile(filepath.Join(root, "zero"), 100); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadFile through a link: %v", err)
	}
	if _, err := ReadFile(filepath.Join(root, "big"), 10); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFile over the cap: %v", err)
	}
}

func TestReadAtMost(t *testing.T) {
	if data, err := ReadAtMost(strings.NewReader("12345"), 5); err != nil || string(data) != "12345" {
		t.Errorf("max bytes exactly: %q, %v", data, err)
	}
	if data, err := ReadAtMost(strings.NewReader("123456"), 5); !errors.Is(err, ErrTooLarge) || data != nil {
		t.Errorf("one byte more: %q, %v", data, err)
	}
}
