package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestExtensionModulesAreNamesOnlyEachOnce(t *testing.T) {
	dir := t.TempDir()
	manifests := map[string]string{
		"drv.json":  `{"name": "drv", "modules": ["acpi_call", "e1000"]}`,
		"bad.json":  `{"name": "bad", "modules": ["-v", "../../etc/x", "a b", "", "e1000", "ok-name"]}`,
		"none.json": `{"name": "none"}`,
	}
	for file, text := range manifests {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var said []string
	say := func(format string, args ...interface{}) { said = append(said, fmt.Sprintf(format, args...)) }
	got := extensionModules(listExtensions(dir), say)
	// manifests are read in name order: bad, drv, none
	if want := []string{"e1000", "ok-name", "acpi_call"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("modules %v, want %v", got, want)
	}
	if len(said) != 4 || !strings.Contains(said[0], `extension bad: "-v" is not a module name`) {
		t.Fatalf("reports %q", said)
	}
}

func TestLoadExtensionModulesReportsWhatTheKernelRefuses(t *testing.T) {
	// /bin/false stands in for a modprobe whose module is missing; the real one runs in the e2e boot
	var said []string
	say := func(format string, args ...interface{}) { said = append(said, fmt.Sprintf(format, args...)) }
	loaded := loadExtensionModules("/bin/false", []Extension{{Name: "drv", Modules: []string{"acpi_call"}}}, say)
	if loaded != 0 || len(said) != 2 || !strings.HasPrefix(said[0], "extension module acpi_call: not loaded") ||
		said[1] != "extension modules: 0 of 1 loaded (acpi_call)" {
		t.Fatalf("loaded %d, reports %q", loaded, said)
	}
}
