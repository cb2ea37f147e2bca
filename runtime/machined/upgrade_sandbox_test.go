package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"kiln/machined/internal/bootstate"
	"kiln/machined/internal/supervisor"
)

// runReaped runs cmd as runInstaller does, through the package's reaper (which some tests start,
// and which would take the exit status from exec.Cmd.Wait), and returns its output.
func runReaped(cmd *exec.Cmd) ([]byte, error) {
	out, done, err := supervisor.Children().StartPiped(cmd)
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(out)
	out.Close()
	status := <-done
	if !status.Exited() || status.ExitStatus() != 0 {
		return b, fmt.Errorf("%s", supervisor.DescribeExit(status))
	}
	return b, nil
}

// TestMain lets the test binary be the sandbox helper, as machined is (main.go), and machined
// itself when runMainEnv is set (user_mode_test.go).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == sandboxCommand {
		os.Exit(sandboxMain(os.Args[2:], os.Stderr))
	}
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The installer runs as an unprivileged user with no capability and no_new_privs, in its own
// PID namespace, on the image read-only after pivot_root, with the slot's directory and grub's on
// BOOT its only writable places and no device node.
func TestTheInstallerRunsIsolated(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (namespaces, mounts)")
	}
	work := t.TempDir()
	root, boot := filepath.Join(work, "root"), filepath.Join(work, "boot")
	for _, d := range []string{filepath.Join(root, "usr/bin"), boot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(work, "host-canary"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", filepath.Join(root, "usr/bin/installer"), "./testdata/sandboxprobe/main.go")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cannot build the probe: %v\n%s", err, out)
	}
	// BOOT, as installSlot mounts it: vfat shows it owned by the sandbox user
	if err := syscall.Mount("tmpfs", boot, "tmpfs", 0, "mode=0700,uid=65533,gid=65533"); err != nil {
		t.Skipf("mount: %v", err)
	}
	defer syscall.Unmount(boot, syscall.MNT_DETACH)
	for _, d := range []string{"A", "B", "grub"} {
		os.Mkdir(filepath.Join(boot, d), 0o700)
		os.Chown(filepath.Join(boot, d), sandboxID, sandboxID)
	}
	if err := prepareSandboxRoot(root); err != nil {
		t.Fatal(err)
	}

	defer func(e string) { sandboxExe = e }(sandboxExe)
	sandboxExe = os.Args[0]
	out, err := runReaped(installerCommand(root, boot, "B", ""))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	for k, want := range map[string]string{
		"pid": "1", "uid": "65533", "gid": "65533", "caps": "0/0", "bounding_chown": "0", "bounding_sys_admin": "0",
		"no_new_privs": "1", "write_root": "open /x: read-only file system",
		"write_boot": "open /boot/probe: read-only file system", "write_boot_A": "open /boot/A/probe: read-only file system",
		"write_boot_B": "<nil>", "write_boot_grub": "<nil>",
		"mount": "operation not permitted", "mknod": "operation not permitted",
		"dev_sda": "stat /dev/sda: no such file or directory", "root": "boot,usr,",
		"args": "[install --upgrade --boot-dir /boot --slot B --tries 3]",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	for _, p := range []string{"B/probe", "grub/probe"} {
		if _, err := os.Stat(filepath.Join(boot, p)); err != nil {
			t.Errorf("the write to BOOT's %s did not land: %v", p, err)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// An image whose /boot is a link (or a file) is refused before anything is mounted there.
func TestTheSandboxRefusesAnImageWhoseBootIsALink(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink("/", filepath.Join(root, "boot")); err != nil {
		t.Fatal(err)
	}
	if err := prepareSandboxRoot(root); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a /boot link: %v", err)
	}
}

// machined's own looks into a pulled image follow none of its links: a link to the machine's
// files reads as what it is, at any level.
func TestLooksIntoThePulledTreeFollowNoLink(t *testing.T) {
	host := t.TempDir() // stands for the machine's own files
	for _, d := range []string{"usr/bin", "usr/share/kiln"} {
		os.MkdirAll(filepath.Join(host, d), 0o755)
	}
	os.WriteFile(filepath.Join(host, "usr/bin/installer"), []byte("#!"), 0o755)
	os.WriteFile(filepath.Join(host, "usr/share/kiln/release.json"), []byte(goodRelease()), 0o644)

	linkedUsr := t.TempDir()
	os.Symlink(filepath.Join(host, "usr"), filepath.Join(linkedUsr, "usr"))
	linkedFiles := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/share/kiln"} {
		os.MkdirAll(filepath.Join(linkedFiles, d), 0o755)
	}
	os.Symlink(filepath.Join(host, "usr/bin/installer"), filepath.Join(linkedFiles, "usr/bin/installer"))
	os.Symlink(filepath.Join(host, "usr/share/kiln/release.json"), filepath.Join(linkedFiles, "usr/share/kiln/release.json"))

	if st, err := lstatUnder(host, "usr/bin/installer"); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		t.Fatalf("a plain tree: %v", err)
	}
	if _, err := readRelease(host, "usr/share/kiln/release.json"); err != nil {
		t.Fatalf("a plain tree: %v", err)
	}
	for name, root := range map[string]string{"usr a link": linkedUsr, "files links": linkedFiles} {
		if st, err := lstatUnder(root, "usr/bin/installer"); err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			t.Errorf("%s: the installer check went through a link", name)
		}
		if _, err := readRelease(root, "usr/share/kiln/release.json"); err == nil {
			t.Errorf("%s: release.json was read through a link", name)
		}
	}
}

// machined itself, built static as an image holds it, writes a slot from inside the sandbox:
// install --upgrade --boot-dir needs nothing the sandbox takes away, and guardBootState sees
// the trial it wrote.
func TestTheRealInstallerWritesItsSlotInTheSandbox(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (namespaces, mounts)")
	}
	if testing.Short() {
		t.Skip("builds machined")
	}
	work := t.TempDir()
	root, boot := filepath.Join(work, "root"), filepath.Join(work, "boot")
	kiln := filepath.Join(root, "usr/share/kiln")
	for _, d := range []string{filepath.Join(root, "usr/bin"), kiln, boot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", filepath.Join(root, "usr/bin/installer"), ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cannot build machined: %v\n%s", err, out)
	}
	for name, body := range map[string]string{"release.json": goodRelease(), "vmlinuz": "kernel v2", "initramfs.zst": "initramfs v2"} {
		if err := os.WriteFile(filepath.Join(kiln, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount("tmpfs", boot, "tmpfs", 0, "mode=0700"); err != nil {
		t.Skipf("mount: %v", err)
	}
	defer syscall.Unmount(boot, syscall.MNT_DETACH)
	before := bootstate.State{Default: "A", Versions: map[string]string{"A": "0.1.0"}}
	for _, d := range []string{"A", "B", "grub"} {
		os.Mkdir(filepath.Join(boot, d), 0o700)
	}
	os.WriteFile(filepath.Join(boot, "A", "vmlinuz"), []byte("kernel v1"), 0o644)
	env := filepath.Join(boot, "grub", "grubenv")
	if err := bootstate.Write(env, before); err != nil {
		t.Fatal(err)
	}
	// as vfat mounted with uid= and gid= shows BOOT
	filepath.Walk(boot, func(p string, _ os.FileInfo, _ error) error { return os.Chown(p, sandboxID, sandboxID) })
	if err := prepareSandboxRoot(root); err != nil {
		t.Fatal(err)
	}

	defer func(e string) { sandboxExe = e }(sandboxExe)
	sandboxExe = os.Args[0]
	var out []byte
	err := guardBootState(env, "B", "0.2.0", func() error {
		var err error
		out, err = runReaped(installerCommand(root, boot, "B", ""))
		return err
	}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	st, _ := bootstate.Read(env)
	if grubBoots(st) != "B" || st.Default != "A" {
		t.Fatalf("state %+v\n%s", st, out)
	}
	cfg, _ := os.ReadFile(filepath.Join(boot, "B", "boot.cfg"))
	kernel, _ := os.ReadFile(filepath.Join(boot, "B", "vmlinuz"))
	old, _ := os.ReadFile(filepath.Join(boot, "A", "vmlinuz"))
	if !strings.HasPrefix(string(cfg), "linux /B/vmlinuz console=ttyS0 panic=1 kiln.slot=B\n") || string(kernel) != "kernel v2" || string(old) != "kernel v1" {
		t.Fatalf("boot.cfg %q, B's kernel %q, A's %q\n%s", cfg, kernel, old, out)
	}
}
