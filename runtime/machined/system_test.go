package main

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kiln/machined/internal/testkit"
)

func TestParseCmdline(t *testing.T) {
	got := parseCmdline(`console=ttyS0 quiet kiln.config="/etc/a b.yaml" kiln.test=poweroff kiln.disk=/dev/vda kiln.disk=none` + "\n")
	want := map[string]string{"console": "ttyS0", "quiet": "", "kiln.config": "/etc/a b.yaml", "kiln.test": "poweroff", "kiln.disk": "none"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
}

const mountinfo = `22 1 7:0 / / ro,nodev,nosuid,relatime shared:1 - squashfs /dev/loop0 ro,errors=continue
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,size=4k,mode=755
24 22 0:21 / /proc rw,nosuid,nodev,noexec - proc proc rw
25 22 0:22 / /run/kiln/with\040space rw - tmpfs tmpfs rw
`

func TestMountinfo(t *testing.T) {
	entries := parseMountinfo(mountinfo)
	if len(entries) != 4 || entries[3].Target != "/run/kiln/with space" || entries[1].FSType != "devtmpfs" {
		t.Fatalf("%+v", entries)
	}
	if ok, what := rootReadOnly(entries); !ok || what != "squashfs (/dev/loop0)" {
		t.Fatalf("squashfs root: %v %s", ok, what)
	}
	rw := strings.Replace(mountinfo, "/ / ro,nodev", "/ / rw,nodev", 1)
	rw = strings.Replace(rw, "squashfs /dev/loop0 ro,", "ext4 /dev/sda1 rw,", 1)
	if ok, what := rootReadOnly(parseMountinfo(rw)); ok || !strings.Contains(what, "read-write") {
		t.Fatalf("rw root: %v %s", ok, what)
	}
	// an overlay stacked later over / is what counts
	stacked := mountinfo + "30 1 0:30 / / ro,relatime - overlay overlay ro,lowerdir=/a:/b\n"
	if _, what := rootReadOnly(parseMountinfo(stacked)); !strings.HasPrefix(what, "overlay") {
		t.Fatalf("stacked root: %s", what)
	}
	if _, ok := mountedAt(entries, "/sys"); ok {
		t.Fatal("/sys is not mounted")
	}
}

func TestCollectModaliases(t *testing.T) {
	root := t.TempDir()
	testkit.WriteFile(t, root+"/pci/devices/0000:00:02.0/modalias", "pci:v00001AF4d00001000sv*\n")
	testkit.WriteFile(t, root+"/virtio/devices/virtio0/modalias", "virtio:d00000001v00001AF4\n")
	testkit.WriteFile(t, root+"/pci/devices/0000:00:03.0/modalias", "pci:v00001AF4d00001000sv*\n") // same device twice
	testkit.WriteFile(t, root+"/platform/devices/empty/modalias", "\n")
	testkit.WriteFile(t, root+"/platform/devices/other/uevent", "MODALIAS=ignored\n")
	testkit.WriteFile(t, root+"/platform/devices/other/power/modalias", "deeper:not-a-device\n") // not a device's own
	got := collectModaliases(root)
	if strings.Join(got, " ") != "pci:v00001AF4d00001000sv* virtio:d00000001v00001AF4" {
		t.Fatalf("%v", got)
	}
	if b := batches([]string{"a", "b", "c"}, 2); len(b) != 2 || len(b[1]) != 1 {
		t.Fatalf("batches %v", b)
	}
}

func TestConfigDriveFiles(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteFile(t, dir+"/user-data", "#cloud-config\nusers: [default]\nservices:\n  - name: web\n    command: /bin/web\n")
	testkit.WriteFile(t, dir+"/meta-data", "instance-id: i-1\nlocal-hostname: from-meta\n")
	cfg, source, err := configFromDir(dir, "/dev/sr0")
	if err != nil || source != "/dev/sr0:user-data" || cfg.Hostname != "from-meta" || cfg.Services[0].Name != "web" {
		t.Fatalf("%+v %s %v", cfg, source, err)
	}
	testkit.WriteFile(t, dir+"/kiln.json", `{"hostname": "from-kiln"}`)
	cfg, source, err = configFromDir(dir, "/dev/sr0")
	if err != nil || source != "/dev/sr0:kiln.json" || cfg.Hostname != "from-kiln" {
		t.Fatalf("%+v %s %v", cfg, source, err)
	}
	testkit.WriteFile(t, dir+"/kiln.yaml", "hostname: [not, a, string]\n")
	if _, _, err := configFromDir(dir, "/dev/sr0"); err == nil || !strings.Contains(err.Error(), "/dev/sr0:kiln.yaml") {
		t.Fatalf("a broken kiln.yaml must be an error naming it: %v", err)
	}
	if _, _, err := configFromDir(t.TempDir(), "/dev/vdb"); err == nil {
		t.Fatal("an empty drive must be an error")
	}
	testkit.WriteFile(t, dir+"/path.yaml", "hostname: by-path\n")
	if cfg, err := configFromParam(dir+"/path.yaml", t.Logf); err != nil || cfg.Hostname != "by-path" {
		t.Fatalf("kiln.config=path: %+v %v", cfg, err)
	}
}

func TestListExtensions(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteFile(t, dir+"/zfs.json", `{"name": "zfs", "version": "2.1", "author": "x", "compatibility": ">=0.1"}`)
	testkit.WriteFile(t, dir+"/gvisor.json", `{"name": "gvisor"}`)
	testkit.WriteFile(t, dir+"/unnamed.json", `{}`)
	testkit.WriteFile(t, dir+"/notes.txt", `ignored`)
	var names []string
	for _, e := range listExtensions(dir) {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "gvisor,unnamed,zfs" {
		t.Fatalf("%v", names)
	}
	if len(listExtensions(filepath.Join(dir, "missing"))) != 0 {
		t.Fatal("no directory, no extensions")
	}
}

func TestMayMatchRulesOutOnlyWhatNoPatternMatches(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteFile(t, dir+"/modules.alias", "# Aliases extracted from modules themselves.\nalias pci:v00008086d000010D3sv*sd*bc*sc*i* e1000e\nalias fs-xfs xfs\nalias usb:v*p*d*dc*dsc*dp*ic08isc06ip50in* usb_storage\nbroken line\n")
	patterns := aliasPatterns(dir + "/modules.alias")
	if len(patterns) != 3 {
		t.Fatalf("patterns %v", patterns)
	}
	aliases := []string{
		"pci:v00008086d000010D3sv00008086sd0000A01Fbc02sc00i00", // e1000e
		"pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00", // virtio-net: built in, no module
		"acpi:PNP0A03:",      // nothing
		"of:Nfoo/barT(null)", // a '/': left to modprobe
		"usb:v0781p5567d0100dc00dsc00dp00ic08isc06ip50in00", // usb_storage
	}
	got := mayMatch(aliases, patterns)
	want := []string{aliases[0], aliases[3], aliases[4]}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %v, want %v", got, want)
	}
	if all := mayMatch(aliases, aliasPatterns(dir+"/missing")); len(all) != len(aliases) {
		t.Fatalf("an unreadable modules.alias must rule nothing out: %v", all)
	}
	if none := mayMatch(aliases, []string{}); len(none) != 1 || none[0] != aliases[3] {
		t.Fatalf("no loadable module: only the alias path.Match cannot judge is kept: %v", none)
	}
}
