package platform

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"kiln/machined/internal/yaml"
)

// The "network-config" format NoCloud drives carry (and Hetzner's metadata embeds) comes in
// two versions; both are read for what static addressing needs: interfaces by MAC or name,
// addresses, gateways, routes, nameservers, MTU and whether to run DHCPv4. Bonds, VLANs and
// bridges are not supported: they are skipped with a warning and DHCP still runs elsewhere.
//
// Version 1: config: [{type: physical, name, mac_address, mtu, subnets: [{type: static|dhcp,
// address, netmask, gateway, dns_nameservers, routes: [{network, netmask, gateway}]}]},
// {type: nameserver, address: [...]}].
// Version 2: ethernets: {ID: {match: {macaddress, name}, addresses, gateway4, gateway6,
// routes: [{to, via}], nameservers: {addresses}, mtu, dhcp4}}.

// parseNetworkConfig parses a network-config document (YAML subset, or JSON).
func parseNetworkConfig(f *facts, doc string, data []byte) (*Network, error) {
	tree, err := parseTree(f.Platform, doc, data)
	if err != nil {
		return nil, err
	}
	return networkFromTree(f, doc, tree)
}

// parseTree parses YAML (machined's subset) or JSON into the encoding/json tree.
func parseTree(platform, doc string, data []byte) (interface{}, error) {
	if len(data) > MaxDocument {
		return nil, docError(platform, doc, fmt.Errorf("%d bytes is more than the %d allowed", len(data), MaxDocument))
	}
	trimmed := strings.TrimLeft(string(data), " \t\r\n\ufeff")
	if strings.HasPrefix(trimmed, "{") {
		var tree interface{}
		dec := json.NewDecoder(strings.NewReader(trimmed))
		dec.UseNumber()
		if err := dec.Decode(&tree); err != nil {
			return nil, docError(platform, doc, fmt.Errorf("invalid JSON: %v", err))
		}
		return tree, nil
	}
	tree, err := yaml.Parse(doc, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", platform, err)
	}
	return tree, nil
}

// networkFromTree reads a parsed network-config; nil when it holds nothing static.
func networkFromTree(f *facts, doc string, tree interface{}) (*Network, error) {
	root := tmap(tree)
	if root == nil {
		if tree == nil {
			return nil, nil // an empty document
		}
		return nil, docError(f.Platform, doc, fmt.Errorf("not a mapping"))
	}
	if inner := tmap(root["network"]); inner != nil { // cloud-init also accepts it wrapped
		root = inner
	}
	version := tstr(root["version"])
	switch {
	case version == "1" || (version == "" && root["config"] != nil):
		if root["config"] == nil {
			return nil, nil // "config: disabled" and the like are not written as a list
		}
		return finishNetwork(networkV1(f, doc, tlist(root["config"]))), nil
	case version == "2" || (version == "" && root["ethernets"] != nil):
		for _, kind := range []string{"bonds", "bridges", "vlans", "wifis"} {
			if root[kind] != nil {
				f.warn("%s: %s are not supported; skipped", doc, kind)
			}
		}
		return finishNetwork(networkV2(f, doc, tmap(root["ethernets"]))), nil
	}
	return nil, docError(f.Platform, doc, fmt.Errorf("version %s is not 1 or 2", quoteShort(version)))
}

func networkV1(f *facts, doc string, config []interface{}) *Network {
	n := &Network{}
	for i, item := range config {
		m := tmap(item)
		where := fmt.Sprintf("%s config[%d]", doc, i)
		switch kind := tstr(m["type"]); kind {
		case "physical":
			b := ifaceBuilder{f: f, doc: where}
			if !b.identify(tstr(m["mac_address"]), tstr(m["name"])) {
				continue
			}
			b.setMTU(tstr(m["mtu"]))
			for j, s := range tlist(m["subnets"]) {
				subnet(&b, n, fmt.Sprintf("%s subnets[%d]", where, j), tmap(s))
			}
			n.Interfaces = append(n.Interfaces, b.Interface)
		case "nameserver":
			addNameservers(f, where, n, tstrs(m["address"])...)
		default:
			f.warn("%s: type %s is not supported; skipped", where, quoteShort(kind))
		}
	}
	return n
}

// subnet applies one v1 subnet to its interface.
func subnet(b *ifaceBuilder, n *Network, where string, s map[string]interface{}) {
	b.doc = where
	addNameservers(b.f, where, n, tstrs(s["dns_nameservers"])...)
	switch kind := tstr(s["type"]); kind {
	case "dhcp", "dhcp4":
		b.DHCP = true
	case "dhcp6", "ipv6_slaac", "ipv6_dhcpv6-stateless", "ipv6_dhcpv6-stateful", "manual":
		// IPv6 autoconfiguration is the kernel's; manual means nothing to configure
	case "static", "static6":
		b.addAddress(tstr(s["address"]), tstr(s["netmask"]))
		b.addGateway(tstr(s["gateway"]))
		for k, r := range tlist(s["routes"]) {
			rm := tmap(r)
			to, ok := joinCIDR(tstr(rm["network"]), tstr(rm["netmask"]))
			if !ok {
				b.f.warn("%s routes[%d]: network %s with netmask %s is not valid; dropped", where, k,
					quoteShort(tstr(rm["network"])), quoteShort(tstr(rm["netmask"])))
				continue
			}
			b.addRoute(to, tstr(rm["gateway"]))
		}
	default:
		b.f.warn("%s: subnet type %s is not supported; skipped", where, quoteShort(kind))
	}
}

func networkV2(f *facts, doc string, ethernets map[string]interface{}) *Network {
	n := &Network{}
	ids := make([]string, 0, len(ethernets))
	for id := range ethernets {
		ids = append(ids, id)
	}
	sort.Strings(ids) // a mapping has no order: keep the result stable
	for _, id := range ids {
		e := tmap(ethernets[id])
		where := fmt.Sprintf("%s ethernets.%s", doc, id)
		b := ifaceBuilder{f: f, doc: where}
		match := tmap(e["match"])
		name := tstr(match["name"])
		if strings.ContainsAny(name, "*?[") {
			name = "" // a glob: the MAC (if any) identifies the interface
		}
		if match == nil {
			name = id // without match, the ID is the interface's name
		}
		if !b.identify(tstr(match["macaddress"]), name) {
			continue
		}
		b.setMTU(tstr(e["mtu"]))
		if v, ok := e["dhcp4"].(bool); ok && v {
			b.DHCP = true
		}
		for _, a := range tstrs(e["addresses"]) {
			b.addAddress(a, "")
		}
		b.addGateway(tstr(e["gateway4"]))
		b.addGateway(tstr(e["gateway6"]))
		for k, r := range tlist(e["routes"]) {
			rm := tmap(r)
			to, via := tstr(rm["to"]), tstr(rm["via"])
			if to == "default" {
				to = "0.0.0.0/0"
				if via != "" && !isIPv4(via) {
					to = "::/0"
				}
			}
			b.doc = fmt.Sprintf("%s routes[%d]", where, k)
			b.addRoute(to, via)
		}
		addNameservers(f, where+" nameservers", n, tstrs(tmap(e["nameservers"])["addresses"])...)
		n.Interfaces = append(n.Interfaces, b.Interface)
	}
	return n
}

// identify sets the interface's MAC and name; it is dropped (false) when neither is valid.
func (b *ifaceBuilder) identify(mac, name string) bool {
	if mac != "" {
		var ok bool
		if b.MAC, ok = parseMAC(mac); !ok {
			b.f.warn("%s: MAC %s is not valid; interface dropped", b.doc, quoteShort(mac))
			return false
		}
	}
	if name != "" {
		if !validIfName(name) {
			b.f.warn("%s: interface name %s is not valid; dropped", b.doc, quoteShort(name))
		} else {
			b.Name = name
		}
	}
	if b.MAC == "" && b.Name == "" {
		b.f.warn("%s: no MAC or name identifies the interface; dropped", b.doc)
		return false
	}
	return true
}

// validIfName is what Linux accepts as an interface name.
func validIfName(s string) bool {
	return len(s) > 0 && len(s) < 16 && s != "." && s != ".." &&
		strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r == '/' || r == ':' || r > 0x7e }) < 0
}

// Accessors for the encoding/json tree: a value of the wrong type reads as absent.

func tmap(v interface{}) map[string]interface{} {
	m, _ := v.(map[string]interface{})
	return m
}

func tlist(v interface{}) []interface{} {
	l, _ := v.([]interface{})
	return l
}

// tstr reads a scalar as text (YAML's 1500 and "1500" alike).
func tstr(v interface{}) string {
	switch s := v.(type) {
	case string:
		return strings.TrimSpace(s)
	case json.Number:
		return s.String()
	case float64:
		return fmt.Sprint(s)
	case bool:
		return fmt.Sprint(s)
	}
	return ""
}

// tstrs reads a list of scalars, or one scalar, as texts.
func tstrs(v interface{}) []string {
	if l, ok := v.([]interface{}); ok {
		out := make([]string, 0, len(l))
		for _, item := range l {
			if s := tstr(item); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	if s := tstr(v); s != "" {
		return []string{s}
	}
	return nil
}
