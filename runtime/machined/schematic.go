package main

import (
	"encoding/json"
	"os"
	"regexp"

	"kiln/machined/internal/safefile"
)

// schematicFile is written by Kiln's imager into the rootfs of an image made from a schematic
// (kiln image --schematic): its ID, the sha256 of the schematic's canonical form, names what the
// image was customised with (extensions, kernel arguments, embedded config), as a factory serves it.
const schematicFile = "/usr/lib/kiln/schematic.json"

// schematicLimit bounds the read: the file holds an ID and the canonical schematic, a few KiB.
const schematicLimit = 256 << 10

var schematicID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// readSchematic is the image's schematic ID, or "" when the image has none or the file is not
// what Kiln writes (too large, not JSON, an ID that is not 64 hex digits).
func readSchematic(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	data, err := safefile.ReadAtMost(f, schematicLimit)
	if err != nil {
		return ""
	}
	var doc struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(data, &doc) != nil || !schematicID.MatchString(doc.ID) {
		return ""
	}
	return doc.ID
}
