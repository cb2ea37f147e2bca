package network

import (
	"fmt"
	"net"
)

// NetworkConfig is the machine config's network section; with no interfaces listed every
// Ethernet interface uses DHCP.
type NetworkConfig struct {
	Interfaces  []InterfaceConfig `json:"interfaces,omitempty"`
	Nameservers []string          `json:"nameservers,omitempty"`
}

// InterfaceConfig configures one interface; with no addresses it uses DHCP.
type InterfaceConfig struct {
	Name      string   `json:"name"`
	DHCP      *bool    `json:"dhcp,omitempty"`
	Addresses []string `json:"addresses,omitempty"` // CIDR: 192.168.1.10/24
	Gateway   string   `json:"gateway,omitempty"`
}

// UsesDHCP says whether the interface uses DHCP: it does unless addresses are given and
// dhcp is not forced on.
func (i InterfaceConfig) UsesDHCP() bool {
	if i.DHCP != nil {
		return *i.DHCP
	}
	return len(i.Addresses) == 0
}

// Validate checks the network section of a machine config.
func (n *NetworkConfig) Validate() error {
	names := map[string]bool{}
	for i, iface := range n.Interfaces {
		if iface.Name == "" {
			return fmt.Errorf("network.interfaces[%d]: name is required", i)
		}
		if names[iface.Name] {
			return fmt.Errorf("network.interfaces: %q is listed twice", iface.Name)
		}
		names[iface.Name] = true
		for _, a := range iface.Addresses {
			if ip, _, err := net.ParseCIDR(a); err != nil || ip.To4() == nil {
				return fmt.Errorf("network.interfaces[%d] (%s): address %q: want IPv4 CIDR such as 192.168.1.10/24", i, iface.Name, a)
			}
		}
		if g := iface.Gateway; g != "" && (net.ParseIP(g) == nil || net.ParseIP(g).To4() == nil) {
			return fmt.Errorf("network.interfaces[%d] (%s): gateway %q is not an IPv4 address", i, iface.Name, g)
		}
		if iface.Gateway != "" && len(iface.Addresses) == 0 {
			return fmt.Errorf("network.interfaces[%d] (%s): a gateway needs a static address", i, iface.Name)
		}
	}
	for _, ns := range n.Nameservers {
		if net.ParseIP(ns) == nil {
			return fmt.Errorf("network.nameservers: %q is not an IP address", ns)
		}
	}
	return nil
}
