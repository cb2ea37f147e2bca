package disk

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Partitions machined creates on the disk it owns, after whatever the image put there
// (EFI, BIOS boot, BOOT, META).
const (
	partState     = "STATE"     // machine config and state that must survive reinstalls of /var
	partEphemeral = "EPHEMERAL" // mounted at /var
	linuxFSType   = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
	mib           = 1 << 20
	stateSize     = 100 * mib
	minEphemeral  = 256 * mib
)

// Partition is an existing partition, in sectors.
type Partition struct {
	Node  string `json:"node"`
	Start uint64 `json:"start"`
	Size  uint64 `json:"size"`
	Type  string `json:"type"`
	Name  string `json:"name"`
}

// DiskLayout is what planPartitions needs to know about a disk.
type DiskLayout struct {
	SectorSize uint64 // bytes per sector
	Sectors    uint64 // whole disk
	HasTable   bool   // a GPT exists; without one the plan starts a new GPT
	FirstLBA   uint64 // usable range of an existing GPT (inclusive)
	LastLBA    uint64
	Partitions []Partition
}

// NewPartition is one partition to create, in sectors.
type NewPartition struct {
	Name  string
	Start uint64
	Size  uint64
}

type extent struct{ start, end uint64 } // [start, end) in sectors

// planPartitions places STATE and EPHEMERAL, whichever is missing, in the largest free
// region of the disk, 1 MiB aligned: STATE gets 100 MiB, EPHEMERAL the rest. It never
// moves or shrinks an existing partition; too little free space is an error.
func planPartitions(d DiskLayout) ([]NewPartition, error) {
	if d.SectorSize == 0 || d.Sectors == 0 {
		return nil, fmt.Errorf("disk size unknown")
	}
	have := map[string]bool{}
	for _, p := range d.Partitions {
		have[p.Name] = true
	}
	var want []string
	for _, name := range []string{partState, partEphemeral} {
		if !have[name] {
			want = append(want, name)
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	if len(d.Partitions)+len(want) > 128 {
		return nil, fmt.Errorf("the GPT has no free entries")
	}
	align := uint64(mib) / d.SectorSize
	first, last := d.FirstLBA, d.LastLBA
	if !d.HasTable {
		// a new GPT: primary header+entries in the first MiB, backup header+entries at the end
		entrySectors := (128*128 + d.SectorSize - 1) / d.SectorSize
		first, last = align, d.Sectors-2-entrySectors
	}
	if last <= first || last >= d.Sectors {
		return nil, fmt.Errorf("the disk is too small (%d sectors)", d.Sectors)
	}
	free := freeExtents(first, last+1, d.Partitions, align)
	if len(free) == 0 {
		return nil, fmt.Errorf("no free space on the disk")
	}
	sort.SliceStable(free, func(i, j int) bool { return free[i].end-free[i].start > free[j].end-free[j].start })
	region := free[0]
	stateSectors, minEph := uint64(stateSize)/d.SectorSize, uint64(minEphemeral)/d.SectorSize
	need := uint64(0)
	for _, name := range want {
		if name == partState {
			need += stateSectors
		} else {
			need += minEph
		}
	}
	if region.end-region.start < need {
		return nil, fmt.Errorf("need %d MiB free for %s, the largest free region is %d MiB",
			need*d.SectorSize/mib, strings.Join(want, " and "), (region.end-region.start)*d.SectorSize/mib)
	}
	var plan []NewPartition
	at := region.start
	for _, name := range want {
		size := stateSectors
		if name == partEphemeral {
			size = (region.end - at) / align * align
		}
		plan = append(plan, NewPartition{Name: name, Start: at, Size: size})
		at += size
	}
	return plan, nil
}

// freeExtents lists the gaps in [first, end) not covered by partitions, aligned inward.
func freeExtents(first, end uint64, parts []Partition, align uint64) []extent {
	sorted := append([]Partition(nil), parts...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	var out []extent
	cursor := first
	add := func(s, e uint64) {
		s = (s + align - 1) / align * align
		if e > s && e-s >= align {
			out = append(out, extent{s, e})
		}
	}
	for _, p := range sorted {
		if p.Start > cursor {
			add(cursor, p.Start)
		}
		if p.Start+p.Size > cursor {
			cursor = p.Start + p.Size
		}
	}
	if end > cursor {
		add(cursor, end)
	}
	return out
}

// sfdiskScript renders a plan as sfdisk input; without a table it starts a GPT.
func sfdiskScript(d DiskLayout, plan []NewPartition) string {
	var b strings.Builder
	if !d.HasTable {
		b.WriteString("label: gpt\n")
	}
	for _, p := range plan {
		fmt.Fprintf(&b, "start=%d, size=%d, type=%s, name=%s\n", p.Start, p.Size, linuxFSType, p.Name)
	}
	return b.String()
}

// ParseSfdiskJSON reads `sfdisk --json DISK` into a layout (the disk size comes from elsewhere).
func ParseSfdiskJSON(data []byte) (DiskLayout, error) {
	var doc struct {
		Table struct {
			Label      string      `json:"label"`
			FirstLBA   uint64      `json:"firstlba"`
			LastLBA    uint64      `json:"lastlba"`
			SectorSize uint64      `json:"sectorsize"`
			Partitions []Partition `json:"partitions"`
		} `json:"partitiontable"`
	}
	// sfdisk's warnings on stderr ("The backup GPT table is not on the end of the device", as on
	// an image written to a bigger disk) come before the document in the combined output
	if i := strings.IndexByte(string(data), '{'); i > 0 {
		data = data[i:]
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return DiskLayout{}, fmt.Errorf("sfdisk --json: %v", err)
	}
	t := doc.Table
	if t.Label != "gpt" {
		return DiskLayout{}, fmt.Errorf("the disk has a %q partition table; machined only extends GPT", t.Label)
	}
	if t.SectorSize == 0 {
		t.SectorSize = 512
	}
	return DiskLayout{SectorSize: t.SectorSize, HasTable: true, FirstLBA: t.FirstLBA, LastLBA: t.LastLBA, Partitions: t.Partitions}, nil
}
