package main

// Observed resources: what the kernel, the supervisor, the boot slots and the clock have now
// (network/link, network/address, service/status, boot/state, time/status), refreshed every
// observeEvery (links and addresses after each network apply too). They are the machine's
// facts, not its wishes: `kiln node get addresses` reads them, and the health verdict is judged
// from them.

import (
	"context"
	"net"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
)

const (
	linkType    resource.Type = "network/link"
	addressType resource.Type = "network/address"
	serviceType resource.Type = "service/status"
	bootType    resource.Type = "boot/state"
	timeType    resource.Type = "time/status"

	observeEvery = 2 * time.Second
)

// linkSpec is one network interface as the kernel has it.
type linkSpec struct {
	Name     string `json:"name"`
	MAC      string `json:"mac,omitempty"`
	MTU      int    `json:"mtu"`
	Up       bool   `json:"up"`
	Loopback bool   `json:"loopback,omitempty"`
}

// addressSpec is one address an interface has.
type addressSpec struct {
	Interface string `json:"interface"`
	Address   string `json:"address"` // ADDRESS/PREFIX
	Family    string `json:"family"`  // inet or inet6
	Scope     string `json:"scope"`   // global, link or host
}

// readLinks is where the links observer reads from: the kernel (readKernelLinks), or a test.
type readLinks func() ([]linkSpec, []addressSpec, error)

// readKernelLinks lists every interface and its addresses.
func readKernelLinks() ([]linkSpec, []addressSpec, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, nil, err
	}
	var links []linkSpec
	var addresses []addressSpec
	for _, iface := range ifaces {
		links = append(links, linkSpec{
			Name: iface.Name, MAC: iface.HardwareAddr.String(), MTU: iface.MTU,
			Up: iface.Flags&net.FlagUp != 0, Loopback: iface.Flags&net.FlagLoopback != 0,
		})
		got, err := iface.Addrs()
		if err != nil {
			continue // the interface went away between the two calls: the next period sees it
		}
		for _, a := range got {
			if ipnet, ok := a.(*net.IPNet); ok {
				addresses = append(addresses, addressOf(iface.Name, ipnet))
			}
		}
	}
	return links, addresses, nil
}

func addressOf(iface string, n *net.IPNet) addressSpec {
	family, scope := "inet6", "global"
	if n.IP.To4() != nil {
		family = "inet"
	}
	switch {
	case n.IP.IsLoopback():
		scope = "host"
	case n.IP.IsLinkLocalUnicast():
		scope = "link"
	}
	return addressSpec{Interface: iface, Address: n.String(), Family: family, Scope: scope}
}

// linksObserver keeps network/link and network/address equal to what the kernel has.
type linksObserver struct{ read readLinks }

func (c *linksObserver) Name() string             { return "links" }
func (c *linksObserver) Inputs() []resource.Type  { return []resource.Type{networkStatusType} }
func (c *linksObserver) Outputs() []resource.Type { return []resource.Type{linkType, addressType} }
func (c *linksObserver) Every() time.Duration     { return observeEvery }

func (c *linksObserver) Reconcile(_ context.Context, r *resource.Run) error {
	links, addresses, err := c.read()
	if err != nil {
		return err // the resources stay as last seen; the runtime retries
	}
	for _, l := range links {
		if err := r.Put(linkType, l.Name, l); err != nil {
			return err
		}
	}
	for _, a := range addresses {
		if err := r.Put(addressType, a.Interface+"/"+a.Address, a); err != nil {
			return err
		}
	}
	return nil
}

// servicesObserver keeps service/status equal to what the supervisor says of each service.
type servicesObserver struct {
	read func() []supervisor.ServiceStatus
}

func (c *servicesObserver) Name() string             { return "services" }
func (c *servicesObserver) Inputs() []resource.Type  { return nil }
func (c *servicesObserver) Outputs() []resource.Type { return []resource.Type{serviceType} }
func (c *servicesObserver) Every() time.Duration     { return observeEvery }

func (c *servicesObserver) Reconcile(_ context.Context, r *resource.Run) error {
	for _, s := range c.read() {
		if err := r.Put(serviceType, s.Name, s); err != nil {
			return err
		}
	}
	return nil
}

// observedAddresses is interface -> ADDRESS/PREFIX of every address but loopback's, as the
// network/address resources have them.
func observedAddresses(state *resource.State) map[string][]string {
	out := map[string][]string{}
	for _, res := range state.List(addressType) {
		if a, ok := resource.SpecOf[addressSpec](res); ok && res.Phase == resource.Running && a.Scope != "host" {
			out[a.Interface] = append(out[a.Interface], a.Address)
		}
	}
	return out
}

// observedServices is every service as the service/status resources have it.
func observedServices(state *resource.State) []supervisor.ServiceStatus {
	out := []supervisor.ServiceStatus{}
	for _, res := range state.List(serviceType) {
		if s, ok := resource.SpecOf[supervisor.ServiceStatus](res); ok && res.Phase == resource.Running {
			out = append(out, s)
		}
	}
	return out
}

// snapshotObserver keeps one resource equal to what read says now; read's false (nothing to
// say, as off an A/B disk) removes it.
type snapshotObserver struct {
	name string
	typ  resource.Type
	id   string
	read func() (interface{}, bool)
}

func (c *snapshotObserver) Name() string             { return c.name }
func (c *snapshotObserver) Inputs() []resource.Type  { return nil }
func (c *snapshotObserver) Outputs() []resource.Type { return []resource.Type{c.typ} }
func (c *snapshotObserver) Every() time.Duration     { return observeEvery }

func (c *snapshotObserver) Reconcile(_ context.Context, r *resource.Run) error {
	if spec, ok := c.read(); ok {
		return r.Put(c.typ, c.id, spec)
	}
	return nil
}

// observers are the machine's observed resources' controllers.
func (m *machine) observers() []resource.Controller {
	// what the boot sets up before ready (the slots) is read only after it
	afterReady := func(read func() (interface{}, bool)) func() (interface{}, bool) {
		return func() (interface{}, bool) {
			select {
			case <-m.isReady:
				return read()
			default:
				return nil, false
			}
		}
	}
	bootState := afterReady(func() (interface{}, bool) {
		status := m.slots.status()
		return status, status != nil
	})
	timeStatus := func() (interface{}, bool) { return m.timeStatus(), true }
	return []resource.Controller{
		&linksObserver{read: readKernelLinks},
		&servicesObserver{read: m.Services},
		&snapshotObserver{name: "bootstate", typ: bootType, id: "slots", read: bootState},
		&snapshotObserver{name: "clock", typ: timeType, id: "clock", read: timeStatus},
	}
}
