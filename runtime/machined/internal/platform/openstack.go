package platform

import (
	"context"
	"errors"
	"fmt"
)

// openstack reads the config drive (label config-2) when there is one, else the metadata
// service: openstack/latest/meta_data.json (uuid, hostname), user_data (absent when none) and
// network_data.json, whose links and networks become Network facts. The config drive comes
// first because it needs no network: clouds without DHCP provide one for exactly that reason.
type openstack struct{ noReadyReport }

const (
	osMeta    = "openstack/latest/meta_data.json"
	osUser    = "openstack/latest/user_data"
	osNetwork = "openstack/latest/network_data.json"
)

func (openstack) Name() string { return "openstack" }

func (openstack) Fetch(ctx context.Context, env Env) (Facts, error) {
	ctx, cancel := env.withDeadline(ctx)
	defer cancel()
	files, device, found, err := readDrive("openstack", env, DriveQuery{Labels: []string{"config-2"}, Files: []string{osMeta, osUser, osNetwork}})
	if err != nil {
		return Facts{}, err
	}
	source := "openstack config drive " + device
	if !found {
		fe, err := newFetcher("openstack", env)
		if err != nil {
			return Facts{}, err
		}
		files = map[string][]byte{}
		for _, doc := range []string{osMeta, osUser, osNetwork} {
			limit := int64(MaxDocument)
			if doc == osUser {
				limit = MaxUserData
			}
			data, err := fe.get(ctx, "/"+doc, doc, limit, nil)
			if errors.Is(err, errNotFound) && doc != osMeta {
				continue // no user data; a cloud too old for network_data.json
			}
			if err != nil {
				return Facts{}, err
			}
			files[doc] = data
		}
		source = "openstack metadata service " + fe.base
	}
	f, err := parseOpenStack(files)
	if err != nil {
		return Facts{}, err
	}
	f.Source = source
	return f.Facts, nil
}

// parseOpenStack reads the three documents (from a drive or the service).
func parseOpenStack(files map[string][]byte) (*facts, error) {
	meta, ok := files[osMeta]
	if !ok {
		return nil, docError("openstack", osMeta, errors.New("missing"))
	}
	var md struct {
		UUID     text `json:"uuid"`
		Hostname text `json:"hostname"`
		Name     text `json:"name"`
	}
	if err := decodeJSON("openstack", osMeta, meta, &md); err != nil {
		return nil, err
	}
	f := newFacts("openstack")
	f.setHostname(string(md.Hostname), osMeta+" hostname")
	f.setHostname(string(md.Name), osMeta+" name")
	f.setInstanceID(string(md.UUID), osMeta+" uuid")
	f.setUserData(files[osUser])
	if data, ok := files[osNetwork]; ok {
		n, err := parseNetworkData(f, data)
		if err != nil {
			return nil, err
		}
		f.Network = n
	}
	return f, nil
}

type osRoute struct {
	Network text `json:"network"`
	Netmask text `json:"netmask"`
	Gateway text `json:"gateway"`
}

type osService struct {
	Type    text `json:"type"`
	Address text `json:"address"`
}

// parseNetworkData maps network_data.json: links are NICs (by MAC), networks are addresses on
// a link (static ipv4/ipv6, or ipv4_dhcp), services are nameservers.
func parseNetworkData(f *facts, data []byte) (*Network, error) {
	var nd struct {
		Links []struct {
			ID  text `json:"id"`
			Typ text `json:"type"`
			MAC text `json:"ethernet_mac_address"`
			MTU text `json:"mtu"`
		} `json:"links"`
		Networks []struct {
			Link      text        `json:"link"`
			Typ       text        `json:"type"`
			IPAddress text        `json:"ip_address"`
			Netmask   text        `json:"netmask"`
			Routes    []osRoute   `json:"routes"`
			Services  []osService `json:"services"`
		} `json:"networks"`
		Services []osService `json:"services"`
	}
	if err := decodeJSON("openstack", osNetwork, data, &nd); err != nil {
		return nil, err
	}
	n := &Network{}
	builders := []*ifaceBuilder{}
	byLink := map[string]*ifaceBuilder{}
	for i, l := range nd.Links {
		where := fmt.Sprintf("%s links[%d]", osNetwork, i)
		if l.Typ == "vlan" || l.Typ == "bond" {
			f.warn("%s: %s links are not supported; skipped", where, l.Typ)
			continue
		}
		b := &ifaceBuilder{f: f, doc: where}
		if !b.identify(string(l.MAC), "") {
			continue
		}
		b.setMTU(string(l.MTU))
		builders = append(builders, b)
		byLink[string(l.ID)] = b
	}
	dns := func(where string, services []osService) {
		for _, s := range services {
			if s.Type == "dns" {
				addNameservers(f, where, n, string(s.Address))
			}
		}
	}
	for i, nw := range nd.Networks {
		where := fmt.Sprintf("%s networks[%d]", osNetwork, i)
		b, ok := byLink[string(nw.Link)]
		if !ok {
			f.warn("%s: link %s is not a usable link; skipped", where, quoteShort(string(nw.Link)))
			continue
		}
		b.doc = where
		switch nw.Typ {
		case "ipv4_dhcp":
			b.DHCP = true
		case "ipv4", "ipv6":
			if b.addAddress(string(nw.IPAddress), string(nw.Netmask)) {
				for k, r := range nw.Routes {
					to, ok := joinCIDR(string(r.Network), string(r.Netmask))
					if !ok {
						f.warn("%s routes[%d]: network %s with netmask %s is not valid; dropped", where, k,
							quoteShort(string(r.Network)), quoteShort(string(r.Netmask)))
						continue
					}
					b.addRoute(to, string(r.Gateway))
				}
			}
		case "ipv6_dhcp", "ipv6_slaac", "ipv6_dhcpv6-stateless", "ipv6_dhcpv6-stateful":
			// the kernel autoconfigures IPv6
		default:
			f.warn("%s: network type %s is not supported; skipped", where, quoteShort(string(nw.Typ)))
		}
		dns(where+" services", nw.Services)
	}
	dns(osNetwork+" services", nd.Services)
	for _, b := range builders {
		n.Interfaces = append(n.Interfaces, b.Interface)
	}
	return finishNetwork(n), nil
}
