package platform

import (
	"errors"
	"fmt"
)

// hcloud reads Hetzner Cloud's metadata service: hetzner/v1/userdata (raw, empty when none)
// and hetzner/v1/metadata, a YAML document. Only its plain top-level keys hostname and
// instance-id are read line by line (the document also holds values machined's YAML subset
// does not take); its network-config block (cloud-init's version 1) is parsed on its own for
// the static IPv6 address Hetzner gives each server, since DHCP only gives IPv4.
var hcloud = documentService{name: "hcloud", document: "hetzner/v1/metadata", parse: parseHcloudMetadata,
	userData: "hetzner/v1/userdata"}

func parseHcloudMetadata(data []byte) (*facts, error) {
	const doc = "hetzner/v1/metadata"
	if len(data) > MaxDocument {
		return nil, docError("hcloud", doc, fmt.Errorf("%d bytes is more than the %d allowed", len(data), MaxDocument))
	}
	keys := topLevelKeys(data, "hostname", "instance-id")
	if len(keys) == 0 {
		return nil, docError("hcloud", doc, errors.New("no hostname or instance-id: not a metadata document"))
	}
	f := newFacts("hcloud")
	f.setHostname(keys["hostname"], doc)
	f.setInstanceID(keys["instance-id"], doc)
	if block := topLevelBlock(data, "network-config"); block != nil {
		n, err := parseNetworkConfig(f, doc+" network-config", block)
		if err != nil {
			f.warn("network-config dropped: %v", err) // DHCP still gives IPv4
		}
		f.Network = n
	}
	return f, nil
}
