package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/platform"
	"kiln/machined/internal/testkit"
)

func TestConfigDriveRule(t *testing.T) {
	kept := "/dev/vda5:config.json"
	cases := []struct {
		mode, kept string
		probeErr   error
		allowed    bool
		why        string // a part of the reason said
	}{
		{"", "", nil, true, ""},                                     // first boot: nothing kept yet
		{"", kept, nil, false, "kiln.config.drive=replace"},         // later boots: ignored, and how to allow it
		{"replace", kept, nil, true, "replaces the config kept in"}, // the owner allowed it
		{"replace", "", nil, true, "kiln.config.drive=replace"},
		{"", "", errors.New("mount: EIO"), true, "no kept config could be read"},
		{"yes", kept, nil, false, `kiln.config.drive="yes" is not "replace"`},
		{"yes", "", nil, true, `(kiln.config.drive="yes" is not "replace"`},
	}
	for _, c := range cases {
		v := decideConfigDrive(c.mode, c.kept, c.probeErr)
		if !v.decided || v.allowed != c.allowed || !strings.Contains(v.why, c.why) || strings.TrimSpace(v.why) != v.why {
			t.Errorf("mode %q kept %q err %v: %+v", c.mode, c.kept, c.probeErr, v)
		}
	}
}

func TestFindKeptConfigLooksOnEverySTATE(t *testing.T) {
	devs := []disk.BlockDev{
		{Name: "sda", Path: "/dev/sda"},
		{Name: "sda1", Path: "/dev/sda1", Disk: "sda", PartName: "STATE"}, // a stick's, unreadable
		{Name: "vda4", Path: "/dev/vda4", Disk: "vda", PartName: "EPHEMERAL"},
		{Name: "vda5", Path: "/dev/vda5", Disk: "vda", PartName: "STATE"},
	}
	var asked []string
	keptOn := func(dev string) (bool, error) {
		asked = append(asked, dev)
		if dev == "/dev/sda1" {
			return false, errors.New("mount: EINVAL")
		}
		return dev == "/dev/vda5", nil
	}
	where, err := findKeptConfig(devs, keptOn)
	if where != "/dev/vda5:config.json" || err != nil || strings.Join(asked, " ") != "/dev/sda1 /dev/vda5" {
		t.Fatalf("%q %v (asked %v)", where, err, asked)
	}
	where, err = findKeptConfig(devs[:3], keptOn)
	if where != "" || err == nil || !strings.Contains(err.Error(), "/dev/sda1") {
		t.Fatalf("an unreadable STATE only: %q %v", where, err)
	}
	if where, err := findKeptConfig(nil, keptOn); where != "" || err != nil {
		t.Fatalf("no STATE: %q %v", where, err)
	}
}

func TestKeptConfigIn(t *testing.T) {
	dir := t.TempDir()
	if kept, err := keptConfigIn(dir); kept || err != nil {
		t.Fatalf("empty STATE: %v %v", kept, err)
	}
	testkit.WriteFile(t, dir+"/config.json", "")
	if kept, err := keptConfigIn(dir); kept || err != nil {
		t.Fatalf("empty config.json: %v %v", kept, err)
	}
	testkit.WriteFile(t, dir+"/config.json", `{"hostname": "a"}`)
	if kept, err := keptConfigIn(dir); !kept || err != nil {
		t.Fatalf("kept config: %v %v", kept, err)
	}
	other := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(other, "config.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := keptConfigIn(other); err == nil {
		t.Fatal("a link for config.json is read")
	}
}

func TestConfigDriveIgnoredSaysWhyAndHow(t *testing.T) {
	m := &machine{con: quietConsole(), params: map[string]string{}}
	m.configDrive = decideConfigDrive("", "/dev/vda5:config.json", nil)
	if m.configDriveAllowed("/dev/sdb1") {
		t.Fatal("a config drive replaced a kept config")
	}
	said := strings.Join(m.con.log.Lines(), "\n")
	if !strings.Contains(said, "config drive /dev/sdb1 ignored") || !strings.Contains(said, "kiln.config.drive=replace") {
		t.Fatalf("console: %s", said)
	}
	m = &machine{con: quietConsole(), params: map[string]string{paramConfigDrive: "replace"}}
	if !m.configDriveAllowed("/dev/sdb1") || !strings.Contains(strings.Join(m.con.log.Lines(), ""), "replace") {
		t.Fatalf("kiln.config.drive=replace: %+v %q", m.configDrive, m.con.log.Lines())
	}
}

// nocloud's user data, hostname and network come from a cidata drive too: the same rule.
func TestNoCloudDriveFollowsTheConfigDriveRule(t *testing.T) {
	facts := platform.Facts{UserData: []byte("hostname: from-stick\n"), Hostname: "meta", Source: "nocloud drive /dev/sdb",
		Network: &platform.Network{Interfaces: []platform.Interface{{Name: "eth0", Addresses: []string{"10.6.6.6/24"}}}}}
	compose := func(kept string) *composition {
		m := &machine{con: quietConsole(), params: map[string]string{}}
		m.configDrive = decideConfigDrive("", kept, nil)
		c := &configController{driveAllowed: m.configDriveAllowed, say: m.con.printf}
		return c.compose(sourceSpec{}, &platformState{impl: mustLookup(t, "nocloud"), facts: facts, fromConfigDrive: true})
	}
	if got := compose("/dev/vda5:config.json"); got.source != "" || got.cfg.Hostname != "" || len(got.cfg.Network.Interfaces) != 0 {
		t.Fatalf("a refused cidata drive was used: %q %+v", got.source, got.cfg)
	}
	if got := compose(""); got.source != "nocloud:user-data" || got.cfg.Hostname != "from-stick" {
		t.Fatalf("the first boot's cidata drive: %q %+v", got.source, got.cfg)
	}
	if !isConfigDriveQuery(platform.DriveQuery{Labels: []string{"CIDATA"}}) || isConfigDriveQuery(platform.DriveQuery{Labels: []string{"config-2"}}) {
		t.Fatal("isConfigDriveQuery")
	}
}

// A hostile drive: a link to /dev/zero (PID 1 would read forever), a FIFO, an oversized file.
// Each is refused at once and named; none is skipped for the next file.
func TestConfigDriveFilesAreReadBoundedWithoutFollowingLinks(t *testing.T) {
	for name, lay := range map[string]func(dir string) error{
		"link to /dev/zero": func(dir string) error { return os.Symlink("/dev/zero", filepath.Join(dir, "kiln.yaml")) },
		"link to a file": func(dir string) error {
			return os.Symlink(filepath.Join(dir, "user-data"), filepath.Join(dir, "kiln.yaml"))
		},
		"oversized": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "kiln.yaml"), make([]byte, maxRemoteConfig+1), 0o644)
		},
	} {
		dir := t.TempDir()
		testkit.WriteFile(t, dir+"/user-data", "hostname: fallback\n")
		if err := lay(dir); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, _, err := configFromDir(dir, "/dev/sdb"); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "kiln.yaml") {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the read does not end", name)
		}
	}
	dir := t.TempDir()
	testkit.WriteFile(t, dir+"/kiln.yaml", "version: 1\n")
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "meta-data")); err != nil {
		t.Fatal(err)
	}
	if cfg, _, err := configFromDir(dir, "/dev/sdb"); err != nil || cfg.Hostname != "" {
		t.Fatalf("a linked meta-data: %+v %v", cfg, err)
	}
}
