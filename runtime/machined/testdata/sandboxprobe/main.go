// The program the sandbox test runs as an installer: it reports what it can do from inside.

package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

func prctl(op uintptr) uintptr {
	r, _, _ := syscall.RawSyscall6(syscall.SYS_PRCTL, op, 0, 0, 0, 0, 0)
	return r
}

func main() {
	hdr := struct {
		version uint32
		pid     int32
	}{0x20080522, 0}
	var data [2]struct{ eff, perm, inh uint32 }
	syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data)), 0)
	fmt.Printf("pid=%d\nuid=%d\ngid=%d\n", os.Getpid(), os.Getuid(), os.Getgid())
	fmt.Printf("caps=%x/%x\n", data[0].eff|data[0].perm, data[1].eff|data[1].perm)
	fmt.Printf("bounding_chown=%d\n", prctl(23)) // PR_CAPBSET_READ of capability 0
	r, _, _ := syscall.RawSyscall6(syscall.SYS_PRCTL, 23, 21, 0, 0, 0, 0)
	fmt.Printf("bounding_sys_admin=%d\n", r)
	fmt.Printf("no_new_privs=%d\n", prctl(39))
	fmt.Printf("write_root=%v\n", os.WriteFile("/x", []byte("x"), 0o644))
	fmt.Printf("write_boot=%v\n", os.WriteFile("/boot/probe", []byte("x"), 0o644))
	fmt.Printf("write_boot_A=%v\n", os.WriteFile("/boot/A/probe", []byte("x"), 0o644))
	fmt.Printf("write_boot_B=%v\n", os.WriteFile("/boot/B/probe", []byte("x"), 0o644))
	fmt.Printf("write_boot_grub=%v\n", os.WriteFile("/boot/grub/probe", []byte("x"), 0o644))
	fmt.Printf("mount=%v\n", syscall.Mount("tmpfs", "/boot", "tmpfs", 0, ""))
	fmt.Printf("mknod=%v\n", syscall.Mknod("/boot/B/sda", syscall.S_IFBLK|0o600, 8<<8))
	_, err := os.Stat("/dev/sda")
	fmt.Printf("dev_sda=%v\n", err)
	ents, _ := os.ReadDir("/")
	names := ""
	for _, e := range ents {
		names += e.Name() + ","
	}
	fmt.Printf("root=%s\n", names)
	fmt.Printf("args=%v\n", os.Args[1:])
}
