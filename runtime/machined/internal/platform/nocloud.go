package platform

import (
	"context"
)

// nocloud reads a NoCloud drive (filesystem label cidata; vfat shows it as CIDATA): user-data
// as it is, meta-data (YAML or JSON: instance-id, local-hostname) and network-config (version
// 1 or 2, see netconfig.go). The network-config is the user's own static setup, so an invalid
// one is an error rather than a silent fallback to DHCP. With no such drive the facts are
// empty: NoCloud's network variant (a seed URL) is not read.
type nocloud struct{ noReadyReport }

func (nocloud) Name() string { return "nocloud" }

func (nocloud) Fetch(ctx context.Context, env Env) (Facts, error) {
	files, device, found, err := readDrive("nocloud", env, DriveQuery{Labels: []string{"cidata"},
		Files: []string{"user-data", "meta-data", "network-config"}})
	if err != nil {
		return Facts{}, err
	}
	if !found {
		return Facts{Platform: "nocloud", Source: "nocloud: no cidata drive"}, nil
	}
	f, err := parseNoCloud(files)
	if err != nil {
		return Facts{}, err
	}
	f.Source = "nocloud drive " + device
	return f.Facts, nil
}

func parseNoCloud(files map[string][]byte) (*facts, error) {
	f := newFacts("nocloud")
	f.setUserData(files["user-data"])
	if meta, ok := files["meta-data"]; ok {
		var id, host, name string
		if tree, err := parseTree("nocloud", "meta-data", meta); err == nil {
			m := tmap(tree)
			id, host, name = tstr(m["instance-id"]), tstr(m["local-hostname"]), tstr(m["hostname"])
		} else {
			// meta-data written by other tools may use YAML beyond machined's subset:
			// the plain top-level keys are all that is needed
			keys := topLevelKeys(meta, "instance-id", "local-hostname", "hostname")
			id, host, name = keys["instance-id"], keys["local-hostname"], keys["hostname"]
		}
		f.setInstanceID(id, "meta-data instance-id")
		f.setHostname(host, "meta-data local-hostname")
		f.setHostname(name, "meta-data hostname")
	}
	if nc, ok := files["network-config"]; ok {
		n, err := parseNetworkConfig(f, "network-config", nc)
		if err != nil {
			return nil, err
		}
		f.Network = n
	}
	return f, nil
}
