package platform

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"strings"
)

// vmware reads the OVF environment vSphere attaches as an ISO (label "OVF ENV", file
// ovf-env.xml) when a vApp's OVF environment transport is "ISO image". Its PropertySection
// carries the properties the OVA declares:
//
//   - guestinfo.kiln.config: the config, plain text unless guestinfo.kiln.config.encoding says
//     "base64" (or "b64") or "gzip+base64" (or "gz+b64"), as VMware's guestinfo convention for
//     user data has it. OVF property values are XML attributes, whose line breaks are turned
//     into spaces unless escaped, so a YAML config should be base64-encoded;
//   - user-data: the config, always base64, as the OVF datasource convention has it; used
//     when guestinfo.kiln.config is absent;
//   - hostname.
//
// The instance ID is the environment's ve:vCenterId, or its oe:id.
//
// Not implemented: the guestinfo transport, where the same keys are read from the VMX through
// VMware's "backdoor" I/O port (what vmtoolsd's rpctool does). It needs port I/O from the
// guest (an in/out instruction on port 0x5658 with ioperm, not possible in portable Go without
// assembly) and a VMware hypervisor to test against, which this project's CI does not have.
type vmware struct{ noReadyReport }

func (vmware) Name() string { return "vmware" }

// The file's name as it reads on ISO 9660 media without or with Joliet/Rock Ridge names.
var ovfEnvFiles = []string{"ovf-env.xml", "OVF-ENV.XML", "ovf_env.xml", "OVF_ENV.XML"}

func (vmware) Fetch(ctx context.Context, env Env) (Facts, error) {
	files, device, found, err := readDrive("vmware", env, DriveQuery{Labels: []string{"OVF ENV"}, Files: ovfEnvFiles})
	if err != nil {
		return Facts{}, err
	}
	if !found {
		return Facts{Platform: "vmware", Source: "vmware: no OVF environment ISO (guestinfo is not read)"}, nil
	}
	for _, name := range ovfEnvFiles {
		if data, ok := files[name]; ok {
			f, err := parseVMwareOVF(data)
			if err != nil {
				return Facts{}, err
			}
			f.Source = "vmware OVF environment " + device
			return f.Facts, nil
		}
	}
	return Facts{}, fmt.Errorf("vmware: %s has no ovf-env.xml", device)
}

func parseVMwareOVF(data []byte) (*facts, error) {
	const doc = "ovf-env.xml"
	var env struct {
		ID        string `xml:"id,attr"`
		VCenterID string `xml:"vCenterId,attr"`
		Props     []struct {
			Key   string `xml:"key,attr"`
			Value string `xml:"value,attr"`
		} `xml:"PropertySection>Property"`
	}
	if err := decodeXML("vmware", doc, data, "Environment", &env); err != nil {
		return nil, err
	}
	props := map[string]string{}
	for _, p := range env.Props {
		if _, seen := props[p.Key]; !seen {
			props[p.Key] = p.Value
		}
	}
	f := newFacts("vmware")
	f.setHostname(props["hostname"], doc+" hostname")
	f.setInstanceID(env.VCenterID, doc+" ve:vCenterId")
	f.setInstanceID(env.ID, doc+" oe:id")
	if v, ok := props["guestinfo.kiln.config"]; ok {
		enc := props["guestinfo.kiln.config.encoding"]
		config, err := decodeGuestinfo(v, enc)
		if err != nil {
			return nil, docError("vmware", doc, fmt.Errorf("guestinfo.kiln.config (encoding %s): %v", quoteShort(enc), err))
		}
		f.setUserData(config)
	} else if v, ok := props["user-data"]; ok {
		config, err := decodeBase64(v)
		if err != nil {
			return nil, docError("vmware", doc, fmt.Errorf("user-data: %v", err))
		}
		f.setUserData(config)
	}
	return f, nil
}

// decodeGuestinfo decodes a value by its VMware guestinfo encoding name.
func decodeGuestinfo(value, encoding string) ([]byte, error) {
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "":
		if value == "" {
			return nil, nil
		}
		return []byte(value), nil
	case "base64", "b64":
		return decodeBase64(value)
	case "gzip+base64", "gz+b64":
		raw, err := decodeBase64(value)
		if err != nil || raw == nil {
			return nil, err
		}
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("not gzip: %v", err)
		}
		out, err := readLimited(zr, -1, MaxUserData) // a small gzip may inflate hugely
		if err != nil {
			return nil, fmt.Errorf("gunzip: %v", err)
		}
		return out, nil
	}
	return nil, errors.New("unknown encoding (want base64, b64, gzip+base64 or gz+b64)")
}
