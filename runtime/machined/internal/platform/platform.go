// Package platform reads what a cloud or hypervisor tells a machine about itself: its user
// data (machined's config), hostname, instance ID and, where the platform gives them, static
// network facts. The kernel command line names the platform (kiln.platform=<name>); Lookup
// turns that name into a Platform whose Fetch asks the platform's metadata service or reads
// its provisioning drive.
//
// Everything read here comes from outside the machine, so every answer is bounded in time
// and size, and a malformed one is an error or a dropped field, never a panic. The package
// only reads: it mounts nothing and configures nothing (Env.ReadDrive is machined's).
package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Facts is what a platform said about this machine.
type Facts struct {
	Platform string
	// UserData is the raw user data (custom data on Azure), nil when there is none; machined
	// parses and validates it as its config.
	UserData []byte
	// Hostname is a valid DNS name (RFC 1123, at most 253 bytes) or "": an invalid one is
	// dropped with a warning. It may be fully qualified (GCP, AWS give FQDNs).
	Hostname   string
	InstanceID string
	// Network holds static network facts; nil when DHCP on every interface is enough.
	Network *Network
	// Source says where the facts came from, for the console and the API.
	Source string
	// Warnings name the fields that were dropped as invalid (the facts are still usable).
	Warnings []string
}

// Network is the static network setup a platform describes.
type Network struct {
	Interfaces  []Interface
	Nameservers []string // IP addresses
}

// Interface is one NIC. It is identified by MAC; Name is set only when the platform names
// the interface as the guest sees it (nocloud's network-config).
type Interface struct {
	MAC       string   // lower-case, colon-separated; "" when only Name identifies it
	Name      string   // guest interface name, or ""
	Addresses []string // CIDR, host address with prefix: 192.0.2.10/24, 2001:db8::10/64
	Gateway   string   // IPv4 default gateway; IPv6 default routes are in Routes as ::/0
	Routes    []Route
	MTU       int  // 0: leave the default
	DHCP      bool // run DHCPv4 on it (Addresses, when given, are added to what DHCP gives)
}

// Route is a static route through the interface it belongs to.
type Route struct {
	To  string // CIDR of the destination network
	Via string // gateway IP; "" means on-link
}

// Env is what Fetch needs from its caller; the zero value asks the real platform.
type Env struct {
	// BaseURL replaces the platform's metadata address (http://169.254.169.254, the same for
	// every platform here); tests and emulators pass their own.
	BaseURL string
	// WireServerURL replaces Azure's WireServer, http://168.63.129.16 (ReportReady).
	WireServerURL string
	// Client makes the requests; nil means a client that never uses a proxy. Its redirect
	// policy is replaced: only redirects to the same host are followed.
	Client *http.Client
	// ReadDrive reads files from a config drive or provisioning medium (see DriveQuery);
	// nil means the machine has no such drive.
	ReadDrive func(DriveQuery) (files map[string][]byte, device string, err error)
	// Sleep waits between retries; nil means a real sleep that ends with the context.
	Sleep func(time.Duration)
	// Deadline bounds a whole Fetch or ReportReady; 0 means 60 s.
	Deadline time.Duration
	// AllowIMDSv1 lets aws fall back to IMDSv1 (GETs without a session token) when the
	// token request is refused. Off by default: IMDSv1 is what SSRF attacks read.
	AllowIMDSv1 bool
}

// Platform reads one platform's facts.
type Platform interface {
	Name() string
	// Fetch reads the facts within env.Deadline.
	Fetch(ctx context.Context, env Env) (Facts, error)
	// ReportReady tells the platform the machine has booted. Only Azure needs it (a VM that
	// does not report is marked failed after the provisioning timeout); elsewhere it is nil.
	ReportReady(ctx context.Context, env Env, facts Facts) error
}

// MetadataURL is the link-local metadata address every platform here uses by default.
const MetadataURL = "http://169.254.169.254"

const defaultDeadline = 60 * time.Second

var platforms = map[string]Platform{
	"metal":         metal{},
	"aws":           aws{},
	"gcp":           gcp{},
	"azure":         azure{},
	"digital-ocean": digitalOcean,
	"hcloud":        hcloud,
	"vultr":         vultr,
	"openstack":     openstack{},
	"vmware":        vmware{},
	"nocloud":       nocloud{},
}

// Names lists the known platform names, sorted.
func Names() []string {
	names := make([]string, 0, len(platforms))
	for name := range platforms {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the platform kiln.platform= names; "" is metal (no metadata at all).
func Lookup(name string) (Platform, error) {
	if name == "" {
		return metal{}, nil
	}
	if p, ok := platforms[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("unknown platform %q (known: %s)", name, strings.Join(Names(), ", "))
}

// metal has no metadata service: the config comes from kiln.config= or a config drive.
type metal struct{ noReadyReport }

func (metal) Name() string { return "metal" }
func (metal) Fetch(ctx context.Context, env Env) (Facts, error) {
	return Facts{Platform: "metal", Source: "metal: no metadata service"}, nil
}

// noReadyReport is the ReportReady of every platform but Azure: nothing to tell.
type noReadyReport struct{}

func (noReadyReport) ReportReady(context.Context, Env, Facts) error { return nil }

// withDeadline bounds one Fetch or ReportReady by env.Deadline.
func (e Env) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	d := e.Deadline
	if d <= 0 {
		d = defaultDeadline
	}
	return context.WithTimeout(ctx, d)
}

// hostnameRE is RFC 1123, the same rule machined applies to a config's hostname.
var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$`)

// facts collects what a platform read, dropping invalid fields with a warning.
type facts struct {
	Facts
}

func newFacts(platform string) *facts { return &facts{Facts{Platform: platform}} }

func (f *facts) warn(format string, args ...interface{}) {
	if len(f.Warnings) < 100 { // a hostile document cannot grow the list without bound
		f.Warnings = append(f.Warnings, f.Platform+": "+fmt.Sprintf(format, args...))
	}
}

// setHostname keeps the first valid name of those given (in order of preference); doc names
// where it came from, for the warning.
func (f *facts) setHostname(name, doc string) {
	if f.Hostname != "" {
		return
	}
	name = strings.TrimSuffix(strings.TrimSpace(name), ".")
	if name == "" {
		return
	}
	if len(name) > 253 || !hostnameRE.MatchString(name) {
		f.warn("%s: hostname %s is not a valid host name; dropped", doc, quoteShort(name))
		return
	}
	f.Hostname = name
}

// setInstanceID keeps id if it is printable ASCII of a sane length: it ends up in logs and
// in the API, where control characters would do harm.
func (f *facts) setInstanceID(id, doc string) {
	if f.InstanceID != "" {
		return
	}
	id = strings.TrimSpace(id)
	if id == "" {
		return
	}
	if len(id) > 256 || strings.IndexFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		f.warn("%s: instance ID %s is not printable ASCII of at most 256 bytes; dropped", doc, quoteShort(id))
		return
	}
	f.InstanceID = id
}

// setUserData keeps data unless it is empty (some services answer 200 with nothing).
func (f *facts) setUserData(data []byte) {
	if f.UserData == nil && len(data) > 0 {
		f.UserData = data
	}
}

// quoteShort quotes s for a message, cut to a length that keeps a hostile value readable.
func quoteShort(s string) string {
	if len(s) > 80 {
		return fmt.Sprintf("%q...", s[:80])
	}
	return fmt.Sprintf("%q", s)
}

// docError names the platform and the document an error is about.
func docError(platform, doc string, err error) error {
	return fmt.Errorf("%s: %s: %w", platform, doc, err)
}

var errEmpty = errors.New("empty document")
