package platform

import (
	"fmt"
)

// vultr reads Vultr's metadata service: v1.json (the whole tree) and latest/user-data (the
// user data decoded to its raw bytes; 404 when none). The public interface gets its primary
// IPv4 address by DHCP, so it is DHCP plus the additional addresses DHCP does not give; a
// private (VPC) interface is static.
var vultr = documentService{name: "vultr", document: "v1.json", parse: parseVultr, userData: "latest/user-data"}

type vultrAddress struct {
	Address text `json:"address"`
	Netmask text `json:"netmask"`
	Network text `json:"network"`
	Prefix  text `json:"prefix"`
}

func parseVultr(data []byte) (*facts, error) {
	const doc = "v1.json"
	var md struct {
		Hostname   text `json:"hostname"`
		InstanceID text `json:"instanceid"`
		Interfaces []struct {
			MAC         text `json:"mac"`
			NetworkType text `json:"network-type"`
			IPv4        *struct {
				vultrAddress
				Gateway    text           `json:"gateway"`
				Additional []vultrAddress `json:"additional"`
			} `json:"ipv4"`
			IPv6 *struct {
				vultrAddress
			} `json:"ipv6"`
		} `json:"interfaces"`
	}
	if err := decodeJSON("vultr", doc, data, &md); err != nil {
		return nil, err
	}
	f := newFacts("vultr")
	f.setHostname(string(md.Hostname), doc)
	f.setInstanceID(string(md.InstanceID), doc+" instanceid")
	n := &Network{}
	for i, in := range md.Interfaces {
		b := ifaceBuilder{f: f, doc: fmt.Sprintf("%s interfaces[%d]", doc, i)}
		if !b.identify(string(in.MAC), "") {
			continue
		}
		public := in.NetworkType != "private"
		b.DHCP = public
		if in.IPv4 != nil {
			if !public {
				b.addAddress(string(in.IPv4.Address), string(in.IPv4.Netmask))
			}
			for _, a := range in.IPv4.Additional {
				b.addAddress(string(a.Address), string(a.Netmask))
			}
		}
		if in.IPv6 != nil && in.IPv6.Address != "" {
			b.addAddress(string(in.IPv6.Address), string(in.IPv6.Prefix))
		}
		n.Interfaces = append(n.Interfaces, b.Interface)
	}
	f.Network = finishNetwork(n)
	return f, nil
}
