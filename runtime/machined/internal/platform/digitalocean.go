package platform

import (
	"fmt"
)

// digitalOcean reads the droplet metadata service's whole tree at once (metadata/v1.json).
// Droplets get their addresses statically (DHCP only on some), so the public and private
// interfaces become Network facts: the public one carries the default gateways, the anchor
// address (the one reserved IPs route to) is added alongside, and the private one gets its
// address only (its gateway is not a default route).
var digitalOcean = documentService{name: "digital-ocean", document: "metadata/v1.json", parse: parseDigitalOcean}

type doIPv4 struct {
	IPAddress text `json:"ip_address"`
	Netmask   text `json:"netmask"`
	Gateway   text `json:"gateway"`
}

type doInterface struct {
	MAC        text    `json:"mac"`
	IPv4       *doIPv4 `json:"ipv4"`
	AnchorIPv4 *doIPv4 `json:"anchor_ipv4"`
	IPv6       *struct {
		IPAddress text `json:"ip_address"`
		CIDR      text `json:"cidr"`
		Gateway   text `json:"gateway"`
	} `json:"ipv6"`
}

func parseDigitalOcean(data []byte) (*facts, error) {
	const doc = "metadata/v1.json"
	var md struct {
		DropletID  text `json:"droplet_id"`
		Hostname   text `json:"hostname"`
		UserData   text `json:"user_data"`
		Interfaces struct {
			Public  []doInterface `json:"public"`
			Private []doInterface `json:"private"`
		} `json:"interfaces"`
		DNS struct {
			Nameservers []text `json:"nameservers"`
		} `json:"dns"`
	}
	if err := decodeJSON("digital-ocean", doc, data, &md); err != nil {
		return nil, err
	}
	f := newFacts("digital-ocean")
	f.setUserData([]byte(md.UserData))
	f.setHostname(string(md.Hostname), doc)
	f.setInstanceID(string(md.DropletID), doc+" droplet_id")

	n := &Network{}
	add := func(kind string, i int, in doInterface) {
		b := ifaceBuilder{f: f, doc: fmt.Sprintf("%s interfaces.%s[%d]", doc, kind, i)}
		mac, ok := parseMAC(string(in.MAC))
		if !ok {
			f.warn("%s: MAC %s is not valid; interface dropped", b.doc, quoteShort(string(in.MAC)))
			return
		}
		b.MAC = mac
		if in.IPv4 != nil {
			b.addAddress(string(in.IPv4.IPAddress), string(in.IPv4.Netmask))
			if kind == "public" {
				b.addGateway(string(in.IPv4.Gateway))
			}
		}
		if in.AnchorIPv4 != nil {
			b.addAddress(string(in.AnchorIPv4.IPAddress), string(in.AnchorIPv4.Netmask))
		}
		if in.IPv6 != nil && in.IPv6.IPAddress != "" {
			b.addAddress(string(in.IPv6.IPAddress), string(in.IPv6.CIDR))
			if kind == "public" {
				b.addGateway(string(in.IPv6.Gateway))
			}
		}
		n.Interfaces = append(n.Interfaces, b.Interface)
	}
	for i, in := range md.Interfaces.Public {
		add("public", i, in)
	}
	for i, in := range md.Interfaces.Private {
		add("private", i, in)
	}
	for _, s := range md.DNS.Nameservers {
		addNameservers(f, doc+" dns.nameservers", n, string(s))
	}
	f.Network = finishNetwork(n)
	return f, nil
}
