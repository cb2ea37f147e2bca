package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/network"
	"kiln/machined/internal/platform"
	"kiln/machined/internal/safefile"
)

const platformDriveMount = "/run/kiln/platform-drive"

// platformTimeNTP are the time services clouds run for their own machines, on addresses only
// they answer; elsewhere the config's or DHCP's servers are used.
var platformTimeNTP = map[string][]string{
	"aws": {"169.254.169.123"},
	"gcp": {"169.254.169.254"},
}

// platformState is what the platform said: the platform controller's fetch, never changed once
// fetched (platform/metadata carries it).
type platformState struct {
	impl  platform.Platform
	env   platform.Env
	facts platform.Facts
	err   string
	// fromConfigDrive: the facts came from a drive labelled like a config drive (nocloud's
	// cidata), which the config drive's rule governs (configsource_drive.go)
	fromConfigDrive bool
}

func (p *platformState) name() string {
	if p == nil || p.impl == nil {
		return "metal"
	}
	return p.impl.Name()
}

// status is /v1/status's platform section, with the ready report as it stands.
func (p *platformState) status(readyReport string) map[string]interface{} {
	if p == nil || p.impl == nil {
		return map[string]interface{}{"name": "metal"}
	}
	return map[string]interface{}{
		"name":         p.impl.Name(),
		"source":       p.facts.Source,
		"instance_id":  p.facts.InstanceID,
		"hostname":     p.facts.Hostname,
		"warnings":     p.facts.Warnings,
		"error":        p.err,
		"ready_report": readyReport,
	}
}

// needsNetwork says whether the platform's facts come over the network (a metadata service)
// rather than only from a drive; DHCP must be up before they are fetched.
func needsNetwork(name string) bool {
	switch name {
	case "metal", "nocloud", "vmware":
		return false
	}
	return true
}

// fetchPlatform reads kiln.platform='s facts (the platform controller's fetch). An unknown
// platform or a failed fetch is said on the console and leaves the machine on what the config
// gives: it must still come up.
func (m *machine) fetchPlatform() *platformState {
	p := &platformState{}
	impl, err := platform.Lookup(m.params[paramPlatform])
	if err != nil {
		m.con.printf("platform: %v; running as metal", err)
		return p
	}
	p.impl = impl
	if impl.Name() == "metal" {
		return p
	}
	if needsNetwork(impl.Name()) {
		m.net.Configure(network.NetworkConfig{}, 10*time.Second) // DHCP everywhere, to reach the metadata service
		m.linkLocalWithoutDHCP()
	}
	p.env = platform.Env{ReadDrive: func(q platform.DriveQuery) (map[string][]byte, string, error) {
		files, dev, err := readPlatformDrive(q)
		if err == nil && isConfigDriveQuery(q) {
			p.fromConfigDrive = true
		}
		return files, dev, err
	}}
	start := time.Now()
	facts, err := impl.Fetch(context.Background(), p.env)
	p.facts = facts
	for _, warning := range facts.Warnings {
		m.con.printf("platform: %s: %s", impl.Name(), warning)
	}
	if err != nil {
		p.err = err.Error()
		m.con.printf("platform: %v", err)
		return p
	}
	m.con.printf("platform: %s: %s (%d ms)", impl.Name(), facts.Source, time.Since(start).Milliseconds())
	return p
}

// linkLocalWithoutDHCP gives the first Ethernet interface a link-local IPv4 address when DHCP
// gave none, since the metadata service at 169.254.169.254 is on-link: on platforms that
// describe a static network (DigitalOcean) that is how the description is read at all.
func (m *machine) linkLocalWithoutDHCP() {
	addrs := kernelAddresses()
	for _, found := range addrs {
		for _, a := range found {
			if ip, _, err := net.ParseCIDR(a); err == nil && ip.To4() != nil {
				return
			}
		}
	}
	iface, ok := primaryInterface()
	if !ok {
		return
	}
	address := linkLocalFor(iface.HardwareAddr)
	m.con.printf("platform: no DHCP lease; %s takes %s to reach the metadata service", iface.Name, address)
	dhcp := true
	m.net.Configure(network.NetworkConfig{Interfaces: []network.InterfaceConfig{
		{Name: iface.Name, Addresses: []string{address}, DHCP: &dhcp},
	}}, time.Second)
}

// primaryInterface is the first Ethernet interface (lowest index: the NIC a platform attaches
// first), where clouds serve their metadata service.
func primaryInterface() (net.Interface, bool) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return net.Interface{}, false
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagLoopback == 0 && len(iface.HardwareAddr) == 6 {
			return iface, true
		}
	}
	return net.Interface{}, false
}

// metadataInterface tells the network which interface may take DHCP routes covering
// 169.254.0.0/16 (option 121 or 249): on a platform with a metadata service, the primary
// interface, where the service is (Azure and OpenStack route 169.254.169.254 that way);
// on metal and the drive-only platforms (nocloud, vmware) there is no metadata service to
// reach, and no interface takes them.
func metadataInterface(platformName string) func() string {
	impl, err := platform.Lookup(platformName)
	if err != nil || !needsNetwork(impl.Name()) {
		return func() string { return "" }
	}
	return func() string {
		iface, _ := primaryInterface()
		return iface.Name
	}
}

// linkLocalFor derives a stable 169.254.0.0/16 address from a MAC, away from the reserved first
// and last /24 (RFC 3927) and from the metadata address itself.
func linkLocalFor(mac net.HardwareAddr) string {
	third := 1 + int(mac[4])%253 // 1..253
	if third == 169 {
		third = 170
	}
	fourth := 1 + int(mac[5])%254 // 1..254
	return fmt.Sprintf("169.254.%d.%d/16", third, fourth)
}

// fillFromPlatform fills the hostname and static network cfg leaves open from p's facts.
func fillFromPlatform(p *platformState, cfg *Config, say func(string, ...interface{})) {
	facts := p.facts
	if cfg.Hostname == "" && facts.Hostname != "" {
		cfg.Hostname = shortHostname(facts.Hostname)
	}
	if len(cfg.Network.Interfaces) == 0 && facts.Network != nil {
		cfg.Network.Interfaces = platformInterfaces(facts.Network, say)
		if len(cfg.Network.Nameservers) == 0 {
			cfg.Network.Nameservers = facts.Network.Nameservers
		}
		if err := cfg.Network.Validate(); err != nil {
			say("platform: %s: its network facts are not usable (%v); DHCP everywhere", p.name(), err)
			cfg.Network = network.NetworkConfig{}
		}
	}
}

// isConfigDriveQuery says whether a platform asks for a drive labelled like a config drive
// (nocloud's cidata): any stick can carry that label.
func isConfigDriveQuery(q platform.DriveQuery) bool {
	for _, label := range q.Labels {
		for _, want := range configLabels {
			if strings.EqualFold(label, want) {
				return true
			}
		}
	}
	return false
}

// shortHostname fits a platform's (often fully qualified) name into the kernel's 64 bytes.
func shortHostname(name string) string {
	if len(name) <= 64 {
		return name
	}
	return strings.SplitN(name, ".", 2)[0]
}

// platformInterfaces maps the platform's NICs (by MAC, or by name) onto this machine's
// interfaces, IPv4 and IPv6 alike: an IPv6 default route comes as a route to ::/0, often via
// a link-local gateway such as fe80::1.
func platformInterfaces(facts *platform.Network, say func(string, ...interface{})) []network.InterfaceConfig {
	byMAC := map[string]string{}
	if ifaces, err := net.Interfaces(); err == nil {
		for _, iface := range ifaces {
			byMAC[strings.ToLower(iface.HardwareAddr.String())] = iface.Name
		}
	}
	var out []network.InterfaceConfig
	for _, nic := range facts.Interfaces {
		name := nic.Name
		if name == "" {
			name = byMAC[strings.ToLower(nic.MAC)]
		}
		if name == "" {
			say("platform: no interface has MAC %s; skipped", nic.MAC)
			continue
		}
		ic := network.InterfaceConfig{Name: name, Addresses: nic.Addresses, MTU: nic.MTU}
		dhcp := nic.DHCP || len(ic.Addresses) == 0
		ic.DHCP = &dhcp
		if len(ic.Addresses) > 0 {
			ic.Gateway = nic.Gateway
		}
		for _, route := range nic.Routes {
			ic.Routes = append(ic.Routes, network.RouteConfig{To: route.To, Via: route.Via})
		}
		out = append(out, ic)
	}
	return out
}

// reportReady tells the platform the machine is up (Azure's WireServer marks a VM failed
// without it), bounded by the platform package's deadline. It returns what platform/metadata
// says of it: "" when the platform takes no report, "sent" once Azure has it, or the error.
func (m *machine) reportReady(p *platformState) string {
	if p == nil || p.impl == nil || p.err != "" {
		return ""
	}
	if err := p.impl.ReportReady(context.Background(), p.env, p.facts); err != nil {
		m.con.printf("platform: %s: ready report: %v", p.impl.Name(), err)
		return err.Error()
	}
	if p.impl.Name() == "azure" {
		m.con.printf("platform: azure: reported Ready to the WireServer")
		return "sent"
	}
	return ""
}

// readPlatformDrive finds the drive a platform provisions (by label, or by filesystem type
// holding one of the files), mounts it read-only and reads the files. The drive is hostile
// input like the rest of the metadata: only regular files under the mount, never through a
// symlink, each at most q.MaxSize bytes.
func readPlatformDrive(q platform.DriveQuery) (map[string][]byte, string, error) {
	for _, b := range waitForMedia() {
		fstype, label, err := disk.ProbeFS(b.Path)
		if err != nil || fstype == "" {
			continue
		}
		byLabel := false
		for _, want := range q.Labels {
			byLabel = byLabel || strings.EqualFold(label, want)
		}
		byType := false
		for _, want := range q.FSTypes {
			byType = byType || fstype == want
		}
		if !byLabel && !byType {
			continue
		}
		files, err := readDriveFiles(b.Path, fstype, q)
		if err != nil {
			return nil, b.Path, err
		}
		if byLabel || len(files) > 0 {
			return files, b.Path, nil
		}
	}
	return nil, "", platform.ErrNoDrive
}

// waitForMedia lists block devices, waiting up to 3 s for CD drives to report their media.
func waitForMedia() []disk.BlockDev {
	deadline := time.Now().Add(3 * time.Second)
	for {
		var out []disk.BlockDev
		waiting := false
		for _, b := range disk.ListBlockDevices("/sys") {
			if b.Sectors == 0 {
				waiting = waiting || strings.HasPrefix(b.Name, "sr")
				continue
			}
			out = append(out, b)
		}
		if !waiting || time.Now().After(deadline) {
			return out
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readDriveFiles(dev, fstype string, q platform.DriveQuery) (map[string][]byte, error) {
	if err := os.MkdirAll(platformDriveMount, 0o700); err != nil {
		return nil, err
	}
	flags := uintptr(syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC)
	if err := syscall.Mount(dev, platformDriveMount, fstype, flags, ""); err != nil {
		return nil, fmt.Errorf("mount %s (%s): %v", dev, fstype, err)
	}
	defer syscall.Unmount(platformDriveMount, 0)
	return readFilesUnder(platformDriveMount, q.Files, q.MaxSize)
}

// readFilesUnder reads the named files (relative, slash-separated) under root; missing ones
// are left out, a symlink anywhere on the way, a non-regular file or one over maxSize is an
// error. The config drive's reader (configsource.go) reads through the same helper.
func readFilesUnder(root string, names []string, maxSize int64) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, name := range names {
		data, err := readRegularUnder(root, name, maxSize)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		files[name] = data
	}
	return files, nil
}

// readRegularUnder is safefile.ReadUnder with the drive named in its refusals.
func readRegularUnder(root, name string, maxSize int64) ([]byte, error) {
	data, err := safefile.ReadUnder(root, name, maxSize)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("on the drive: %w", err)
	}
	return data, err
}
