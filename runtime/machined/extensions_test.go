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

// writeFiles writes name -> text into dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The extensions controller puts each extension's manifest and the services they define, with
// the files it could not load named; the services' specs (their env may hold secrets) are not
// shown.
func TestTheExtensionsControllerOwnsTheirStatusAndServices(t *testing.T) {
	manifests, services := t.TempDir(), t.TempDir()
	writeFiles(t, manifests, map[string]string{
		"lldpd.json":   `{"name": "lldpd", "version": "1.0.17", "modules": ["8021q"]}`,
		"unnamed.json": `{"version": "2"}`,
	})
	writeFiles(t, services, map[string]string{
		"lldpd.yaml":  "name: lldpd\ncommand: /usr/sbin/lldpd\nenv: {TOKEN: s3cret}\n",
		"broken.yaml": "name: [\n",
	})
	m := &machine{con: quietConsole(), cfg: &Config{}, params: map[string]string{}, isReady: make(chan struct{}),
		extDirs: extensionDirs{manifests: manifests, services: services}}
	m.startControllers(&applyRecorder{})
	exts, svc := m.awaitExtensions()
	want := []Extension{{Name: "lldpd", Version: "1.0.17", Modules: []string{"8021q"}}, {Name: "unnamed", Version: "2"}}
	if !reflect.DeepEqual(exts, want) {
		t.Fatalf("extensions %+v", exts)
	}
	if len(svc.Specs) != 1 || svc.Specs[0].Env["TOKEN"] != "s3cret" || !reflect.DeepEqual(svc.Names, []string{"lldpd"}) ||
		len(svc.Problems) != 1 || !strings.Contains(svc.Problems[0], "broken.yaml") {
		t.Fatalf("services %+v", svc)
	}
	got := m.Resources("extensions")
	if len(got) != 2 || got[0].Owner != "extensions" || got[0].ID != "lldpd" {
		t.Fatalf("kiln node get extensions: %+v", got)
	}
	shown := fmtJSON(t, m.Resources("extension-services"))
	if strings.Contains(shown, "s3cret") || !strings.Contains(shown, `"lldpd"`) || !strings.Contains(shown, "broken.yaml") {
		t.Fatalf("kiln node get extension-services: %s", shown)
	}
	if !strings.Contains(strings.Join(m.con.log.Lines(), "\n"), "broken.yaml") {
		t.Errorf("the broken service file is not on the console: %q", m.con.log.Lines())
	}
}
