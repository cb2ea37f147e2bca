package platform

import (
	"errors"
	"fmt"
)

// DriveQuery asks Env.ReadDrive for files from a config drive or provisioning medium.
//
// ReadDrive (machined's) looks at the block devices in order and takes the first whose
// filesystem label is one of Labels (compared case-insensitively: vfat labels read
// upper-case) or, when FSTypes is set, whose filesystem type is one of FSTypes and which holds
// at least one of Files. It mounts it read-only, reads the Files that exist (paths from the
// filesystem root; absent files are left out of the map), unmounts it, and returns the files
// and the device. A file larger than MaxSize is an error. No matching drive is ErrNoDrive.
type DriveQuery struct {
	Labels  []string
	FSTypes []string // for media with no fixed label: Azure's provisioning DVD is "udf"
	Files   []string
	MaxSize int64
}

// ErrNoDrive is ReadDrive's answer (possibly wrapped) when no drive matches the query.
var ErrNoDrive = errors.New("no matching drive")

// readDrive asks env.ReadDrive and checks its answer; found is false when there is no drive.
func readDrive(platform string, env Env, q DriveQuery) (files map[string][]byte, device string, found bool, err error) {
	if env.ReadDrive == nil {
		return nil, "", false, nil
	}
	if q.MaxSize == 0 {
		q.MaxSize = MaxUserData
	}
	files, device, err = env.ReadDrive(q)
	if errors.Is(err, ErrNoDrive) {
		return nil, "", false, nil
	}
	if err != nil {
		return nil, device, false, fmt.Errorf("%s: reading drive %v: %w", platform, q.Labels, err)
	}
	for name, data := range files {
		if int64(len(data)) > q.MaxSize {
			return nil, device, false, fmt.Errorf("%s: %s:%s: %d bytes is more than the %d allowed", platform, device, name, len(data), q.MaxSize)
		}
	}
	if device == "" {
		device = "drive"
	}
	return files, device, true, nil
}
