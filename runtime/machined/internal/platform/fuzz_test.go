package platform

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds one input to every document parser: none may panic, and whatever facts
// come out hold only valid values (the promise machined's network layer relies on).
func FuzzParse(f *testing.F) {
	_ = filepath.Walk("testdata", func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			if data, err := os.ReadFile(path); err == nil {
				f.Add(data)
			}
		}
		return nil
	})
	for _, s := range []string{"", "{", "[]", "null", `{"interfaces": {"public": [{"mac": "04:01:2a:0f:2a:01", "ipv4": {"ip_address": "1.2.3.4", "netmask": "0"}}]}}`,
		"<Environment><PropertySection><Property key=\"user-data\" value=\"eA==\"/></PropertySection></Environment>",
		"version: 2\nethernets:\n  e:\n    routes: [{to: default, via: \"::1\"}]\n", "hostname: a\nnetwork-config:\n  version: 1\n  config: []\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var all []*facts
		keep := func(fa *facts, err error) {
			if err == nil && fa != nil {
				all = append(all, fa)
			}
		}
		keep(parseDigitalOcean(data))
		keep(parseVultr(data))
		keep(parseHcloudMetadata(data))
		keep(parseVMwareOVF(data))
		keep(parseOpenStack(map[string][]byte{osMeta: data, osNetwork: data}))
		keep(parseNoCloud(map[string][]byte{"meta-data": data, "network-config": data}))
		fa := newFacts("fuzz")
		if n, err := parseNetworkData(fa, data); err == nil {
			fa.Network = n
			keep(fa, nil)
		}
		if ovf, err := parseAzureOVF(data); err == nil {
			fa := newFacts("azure")
			fa.setHostname(ovf.hostname, "ovf-env.xml")
			keep(fa, nil)
		}
		if imds, err := parseAzureIMDS(data); err == nil {
			fa := newFacts("azure")
			fa.setHostname(imds.computerName, "imds")
			fa.setInstanceID(imds.vmID, "imds")
			keep(fa, nil)
		}
		if gs, err := parseGoalState(data); err == nil {
			_ = healthReport(gs)
		}
		_ = topLevelKeys(data, "hostname", "instance-id")
		_ = topLevelBlock(data, "network-config")
		for _, fa := range all {
			checkFacts(t, fa.Facts)
		}
	})
}

func checkFacts(t *testing.T, f Facts) {
	if f.Hostname != "" && (len(f.Hostname) > 253 || !hostnameRE.MatchString(f.Hostname)) {
		t.Fatalf("invalid hostname %q", f.Hostname)
	}
	if len(f.InstanceID) > 256 {
		t.Fatalf("instance ID of %d bytes", len(f.InstanceID))
	}
	if f.Network == nil {
		return
	}
	for _, ns := range f.Network.Nameservers {
		if net.ParseIP(ns) == nil {
			t.Fatalf("nameserver %q", ns)
		}
	}
	for _, i := range f.Network.Interfaces {
		if i.MAC == "" && i.Name == "" {
			t.Fatalf("an interface with no MAC or name: %+v", i)
		}
		if i.MAC != "" {
			if _, err := net.ParseMAC(i.MAC); err != nil {
				t.Fatalf("MAC %q", i.MAC)
			}
		}
		if i.Name != "" && !validIfName(i.Name) {
			t.Fatalf("name %q", i.Name)
		}
		for _, a := range i.Addresses {
			if _, _, err := net.ParseCIDR(a); err != nil {
				t.Fatalf("address %q", a)
			}
		}
		if i.Gateway != "" && !isIPv4(i.Gateway) {
			t.Fatalf("gateway %q", i.Gateway)
		}
		for _, r := range i.Routes {
			if _, _, err := net.ParseCIDR(r.To); err != nil || (r.Via != "" && net.ParseIP(r.Via) == nil) {
				t.Fatalf("route %+v", r)
			}
		}
		if i.MTU != 0 && (i.MTU < 68 || i.MTU > 65535) {
			t.Fatalf("MTU %d", i.MTU)
		}
	}
}
