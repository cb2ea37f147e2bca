package oci

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

var testLimits = Limits{MaxBytes: 1 << 20, MaxEntries: 1000}

// layers unpacks each tar (plain) onto root in order, failing the test on error.
func layers(t *testing.T, root string, tars ...[]byte) {
	t.Helper()
	for i, b := range tars {
		if _, err := Unpack(root, bytes.NewReader(b), MediaTypeLayer, testLimits); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
}

func unpackErr(t *testing.T, root string, b []byte) error {
	t.Helper()
	_, err := Unpack(root, bytes.NewReader(b), MediaTypeLayer, testLimits)
	return err
}

// sandbox is a root inside a directory that must stay as it is: base/{root/, outside/secret}.
func sandbox(t *testing.T) (root, outside string) {
	base := scratch(t)
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

func checkOutside(t *testing.T, outside string) {
	t.Helper()
	if got := tree(t, outside); got != "secret" {
		t.Fatalf("outside now holds:\n%s", got)
	}
	if got := readFile(t, filepath.Join(outside, "secret")); got != "secret" {
		t.Fatalf("secret now %q", got)
	}
	if st, _ := os.Stat(outside); st.Mode().Perm() != 0o755 {
		t.Fatalf("outside's mode changed to %v", st.Mode())
	}
}

func TestUnpackPlainAndGzip(t *testing.T) {
	layer := tarOf(t,
		dir("./"),
		dir("etc/"),
		withMode(file("etc/motd", "hello\n"), 0o640),
		withMode(file("usr/bin/tool", "#!tool"), 0o4755|0o2000|0o1000), // setuid, setgid, sticky dropped
		symlink("usr/bin/link", "../../etc/motd"),
		symlink("abs", "/etc/shadow"),
		hardlink("etc/motd.hard", "etc/motd"),
		withMode(dir("private/"), 0o700),
		file("/absolute/made/relative", "x"),
		file("a/../folded", "y"),
	)
	for _, mt := range []string{MediaTypeLayer, MediaTypeLayerGzip, MediaTypeDockerLayer, "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"} {
		t.Run(mt, func(t *testing.T) {
			root := scratch(t)
			in := layer
			if strings.HasSuffix(mt, "gzip") {
				in = gzipped(t, layer)
			}
			n, err := Unpack(root, bytes.NewReader(in), mt, testLimits)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len("hello\n#!toolxy")) {
				t.Fatalf("wrote %d bytes", n)
			}
			want := strings.Join([]string{
				"abs -> /etc/shadow", "absolute/", "absolute/made/", "absolute/made/relative",
				"etc/", "etc/motd", "etc/motd.hard", "folded", "private/",
				"usr/", "usr/bin/", "usr/bin/link -> ../../etc/motd", "usr/bin/tool",
			}, "\n")
			if got := tree(t, root); got != want {
				t.Fatalf("tree:\n%s\nwant:\n%s", got, want)
			}
			for p, mode := range map[string]os.FileMode{"etc/motd": 0o640, "usr/bin/tool": 0o755, "private": 0o700 | os.ModeDir} {
				st, err := os.Lstat(filepath.Join(root, p))
				if err != nil || st.Mode() != mode {
					t.Errorf("%s: mode %v, want %v (%v)", p, st.Mode(), mode, err)
				}
			}
			a, _ := os.Stat(filepath.Join(root, "etc/motd"))
			b, _ := os.Stat(filepath.Join(root, "etc/motd.hard"))
			if !os.SameFile(a, b) {
				t.Fatal("hard link is a copy")
			}
		})
	}
}

func TestUnpackWhiteouts(t *testing.T) {
	root := scratch(t)
	layers(t, root,
		tarOf(t, file("a/gone", "1"), file("a/keep", "2"), file("d/sub/x", "3"), file("d/y", "4"), symlink("l", "/nowhere")),
		tarOf(t, whiteoutOf("a/.wh.gone"), whiteoutOf(".wh.d"), whiteoutOf(".wh.l"), whiteoutOf("a/.wh.never-was"), whiteoutOf("missing/dir/.wh.x")),
	)
	if got := tree(t, root); got != "a/\na/keep" {
		t.Fatalf("tree:\n%s", got)
	}
}

// A whiteout hides only what earlier layers left: this layer's entries stay, before or after.
func TestUnpackWhiteoutKeepsThisLayer(t *testing.T) {
	root := scratch(t)
	layers(t, root,
		tarOf(t, file("d/old", "1"), file("d/sub/old", "2"), file("f", "3")),
		tarOf(t, file("d/sub/new", "4"), whiteoutOf(".wh.d"), file("d/after", "5"), file("f", "6"), whiteoutOf(".wh.f")),
	)
	if got := tree(t, root); got != "d/\nd/after\nd/sub/\nd/sub/new\nf" {
		t.Fatalf("tree:\n%s", got)
	}
	if readFile(t, filepath.Join(root, "f")) != "6" {
		t.Fatal("f lost")
	}
}

func TestUnpackOpaqueWhiteout(t *testing.T) {
	root := scratch(t)
	layers(t, root,
		tarOf(t, file("o/old", "1"), file("o/sub/old", "2"), file("o/sub2/old", "3"), file("other/stays", "4")),
		tarOf(t, dir("o/"), file("o/sub/new", "5"), whiteoutOf("o/.wh..wh..opq"), file("o/after", "6")),
	)
	want := "o/\no/after\no/sub/\no/sub/new\nother/\nother/stays"
	if got := tree(t, root); got != want {
		t.Fatalf("tree:\n%s\nwant:\n%s", got, want)
	}
	// At the top: everything earlier goes.
	layers(t, root, tarOf(t, file("top", "7"), whiteoutOf(".wh..wh..opq")))
	if got := tree(t, root); got != "top" {
		t.Fatalf("tree:\n%s", got)
	}
}

func TestUnpackWhiteoutRefusals(t *testing.T) {
	root, outside := sandbox(t)
	layers(t, root, tarOf(t, symlink("out", outside), symlink("up", "../outside")))
	for name, why := range map[string]string{
		"out/.wh.secret":      `parent "out" is a symlink`,
		"up/.wh..wh..opq":     `parent "up" is a symlink`,
		".wh..wh.aufs":        "AUFS metadata",
		".wh.":                "whiteout of nothing",
		"x/.wh..":             "whiteout of nothing",
		"../.wh.outside":      "climbs out",
		"a/../../.wh.outside": "climbs out",
	} {
		err := unpackErr(t, root, tarOf(t, whiteoutOf(name)))
		wantErr(t, err, why)
		wantErr(t, err, quote(name))
	}
	// Made relative: it whites out root/outside, which does not exist.
	layers(t, root, tarOf(t, whiteoutOf("/../outside/.wh.secret")))
	checkOutside(t, outside)
}

// The classic: layer 1 makes usr a symlink out of the root, layer 2 writes through it.
func TestUnpackSymlinkParentEscape(t *testing.T) {
	for _, target := range []string{"", "../..", "../outside", "/"} {
		root, outside := sandbox(t)
		if target == "" {
			target = outside
		}
		layers(t, root, tarOf(t, symlink("usr", target)))
		for _, e := range []entry{
			file("usr/evil", "pwned"),
			file("usr/outside/secret", "pwned"),
			dir("usr/evildir/"),
			symlink("usr/evillink", "x"),
			hardlink("usr/secret", "f"),
			file("./usr/./evil", "pwned"),
		} {
			err := unpackErr(t, root, tarOf(t, file("f", "x"), e))
			wantErr(t, err, `parent "usr" is a symlink`)
			wantErr(t, err, quote(e.name))
		}
		// The same within one layer.
		err := unpackErr(t, root, tarOf(t, symlink("lib", target), file("lib/evil", "pwned")))
		wantErr(t, err, `layer entry "lib/evil": parent "lib" is a symlink`)
		checkOutside(t, outside)
		if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "evil")); err == nil {
			t.Fatal("wrote beside the root")
		}
	}
}

func TestUnpackDotDotNames(t *testing.T) {
	root, outside := sandbox(t)
	for _, name := range []string{"../outside/secret", "a/../../outside/secret", "..", "a/b/../../../x", "./../x"} {
		err := unpackErr(t, root, tarOf(t, file(name, "pwned")))
		wantErr(t, err, "climbs out")
		wantErr(t, err, quote(name))
	}
	err := unpackErr(t, root, tarOf(t, file(".", "x")))
	wantErr(t, err, "only a directory may name the root")
	checkOutside(t, outside)
	if got := tree(t, root); got != "" {
		t.Fatalf("root holds:\n%s", got)
	}
	// Cleaned first, then made relative: "/../outside/secret" is root/outside/secret.
	layers(t, root, tarOf(t, file("/../outside/secret", "mine")))
	checkOutside(t, outside)
	if readFile(t, filepath.Join(root, "outside/secret")) != "mine" {
		t.Fatal("not unpacked inside the root")
	}
}

func TestUnpackHardlinkEscape(t *testing.T) {
	root, outside := sandbox(t)
	layers(t, root, tarOf(t, file("f", "x"), symlink("s", "f"), symlink("out", outside), dir("d/")))
	for link, why := range map[string]string{
		"../outside/secret":       "climbs out",
		"/etc/passwd":             `"/etc/passwd" does not exist`, // made relative: root/etc/passwd
		"out/secret":              `parent "out" is a symlink`,
		"s":                       "not a regular file",
		"d":                       "not a regular file",
		"h":                       "hard link to itself",
		"missing/x":               "does not exist",
		strings.Repeat("a", 5000): "longer than",
	} {
		err := unpackErr(t, root, tarOf(t, hardlink("h", link)))
		wantErr(t, err, why)
		wantErr(t, err, `layer entry "h"`)
	}
	checkOutside(t, outside)
	// Writing a file over a hard link replaces the name; the other name keeps its content.
	layers(t, root, tarOf(t, hardlink("h", "f")), tarOf(t, file("h", "new")))
	if readFile(t, filepath.Join(root, "f")) != "x" || readFile(t, filepath.Join(root, "h")) != "new" {
		t.Fatal("wrote through a hard link")
	}
}

func TestUnpackRefusesSpecialFiles(t *testing.T) {
	root := scratch(t)
	for typ, why := range map[byte]string{
		tar.TypeChar:      "device nodes are not allowed",
		tar.TypeBlock:     "device nodes are not allowed",
		tar.TypeFifo:      "FIFOs are not allowed",
		tar.TypeCont:      "entry type '7' is not allowed",
		tar.TypeGNUSparse: "",
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Name: "dev/x", Typeflag: typ, Mode: 0o666, Devmajor: 1, Devminor: 3}); err != nil {
			continue // tar.Writer refuses to write some types; the reader side is what matters
		}
		tw.Close()
		err := unpackErr(t, root, buf.Bytes())
		if err == nil {
			t.Errorf("type %q unpacked", typ)
			continue
		}
		if why != "" {
			wantErr(t, err, why)
			wantErr(t, err, `"dev/x"`)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "dev/x")); err == nil {
		t.Fatal("dev/x exists")
	}
}

func TestUnpackLimits(t *testing.T) {
	root := scratch(t)
	body := strings.Repeat("x", 600)
	n, err := Unpack(root, bytes.NewReader(tarOf(t, file("a", body), file("b", body))), MediaTypeLayer, Limits{MaxBytes: 1000, MaxEntries: 10})
	wantErr(t, err, `layer entry "b": 600 bytes would pass the limit of 1000 bytes`)
	if n != 600 {
		t.Fatalf("wrote %d", n)
	}
	_, err = Unpack(root, bytes.NewReader(tarOf(t, dir("1/"), dir("2/"), dir("3/"))), MediaTypeLayer, Limits{MaxBytes: 1000, MaxEntries: 2})
	wantErr(t, err, "more than 2 entries")
	_, err = Unpack(root, bytes.NewReader(nil), MediaTypeLayer, Limits{})
	wantErr(t, err, "limits must be positive")
}

func TestUnpackMediaTypes(t *testing.T) {
	root := scratch(t)
	plain := tarOf(t, file("x", "y"))
	for mt, why := range map[string]string{
		"application/vnd.oci.image.layer.v1.tar+zstd": "zstd layers",
		"application/x-tar":                           "unsupported layer media type",
		"":                                            "unsupported layer media type",
		MediaTypeLayerGzip:                            "not gzip",
		MediaTypeDockerLayer:                          "not gzip",
	} {
		_, err := Unpack(root, bytes.NewReader(plain), mt, testLimits)
		wantErr(t, err, why)
	}
	// A truncated gzip stream fails, not silently stops.
	gz := gzipped(t, plain)
	_, err := Unpack(root, bytes.NewReader(gz[:len(gz)-4]), MediaTypeLayerGzip, testLimits)
	wantErr(t, err, "unexpected EOF")
	_, err = Unpack(filepath.Join(root, "x"), bytes.NewReader(plain), MediaTypeLayer, testLimits)
	wantErr(t, err, "not a directory")
}

func TestUnpackTrailingData(t *testing.T) {
	root := scratch(t)
	padded := append(tarOf(t, file("x", "y")), make([]byte, 10240)...)
	if _, err := Unpack(root, bytes.NewReader(padded), MediaTypeLayer, testLimits); err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(root, bytes.NewReader(gzipped(t, padded)), MediaTypeLayerGzip, testLimits); err != nil {
		t.Fatal(err)
	}
	bomb := append(tarOf(t, file("x", "y")), make([]byte, maxTrailing+1)...)
	_, err := Unpack(root, bytes.NewReader(gzipped(t, bomb)), MediaTypeLayerGzip, testLimits)
	wantErr(t, err, "follow the tar end marker")
	// Garbage after the gzip stream is another (bad) gzip member.
	_, err = Unpack(root, bytes.NewReader(append(gzipped(t, padded), "junk"...)), MediaTypeLayerGzip, testLimits)
	wantErr(t, err, "after the tar end: unexpected EOF")
}

func TestUnpackReplacesEarlierEntries(t *testing.T) {
	root, outside := sandbox(t)
	layers(t, root,
		tarOf(t, symlink("x", filepath.Join(outside, "secret")), file("d/inner", "1"), file("f", "2"), symlink("dl", outside)),
		tarOf(t, file("x", "mine"), file("d", "now a file"), dir("f/"), file("f/inner", "3"), dir("dl/")),
	)
	want := "d\ndl/\nf/\nf/inner\nx"
	if got := tree(t, root); got != want {
		t.Fatalf("tree:\n%s\nwant:\n%s", got, want)
	}
	checkOutside(t, outside)
}

// Directory modes apply at the end of the layer (so a 0555 directory can be filled), and never
// through a symlink that later replaced the directory.
func TestUnpackDirectoryModes(t *testing.T) {
	root, outside := sandbox(t)
	layers(t, root, tarOf(t,
		withMode(dir("ro/"), 0o555), file("ro/file", "x"),
		withMode(dir("d/"), 0o700), symlink("d", outside),
		withMode(dir("ro2/"), 0o1777),
	))
	if st, _ := os.Lstat(filepath.Join(root, "ro")); st.Mode() != os.ModeDir|0o555 {
		t.Fatalf("ro: %v", st.Mode())
	}
	if st, _ := os.Lstat(filepath.Join(root, "ro2")); st.Mode() != os.ModeDir|0o777 {
		t.Fatalf("ro2: %v (sticky must be dropped)", st.Mode())
	}
	checkOutside(t, outside)
}

func TestUnpackOddNames(t *testing.T) {
	root := scratch(t)
	long := strings.Repeat("a/", 2049)
	for _, e := range []entry{file(long+"x", "y"), symlink("s", strings.Repeat("b", 5000))} {
		wantErr(t, unpackErr(t, root, tarOf(t, e)), "longer than 4096")
	}
	// A file where a later entry wants a directory.
	layers(t, root, tarOf(t, file("f", "x")))
	wantErr(t, unpackErr(t, root, tarOf(t, file("f/g", "y"))), `parent "f" is not a directory`)
}

func TestUnpackAsRootOwnsFiles(t *testing.T) {
	root := scratch(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "owned", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 4242, Gid: 4242, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	layers(t, root, buf.Bytes())
	st, _ := os.Lstat(filepath.Join(root, "owned"))
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		t.Fatalf("owner %d, want the process's %d", sys.Uid, os.Getuid())
	}
}

func TestUnpackSymlinkTargets(t *testing.T) {
	root := scratch(t)
	wantErr(t, unpackErr(t, root, tarOf(t, symlink("s", ""))), "symlink with an empty target")
	// An existing symlink is replaced, never followed.
	layers(t, root, tarOf(t, symlink("s", "a")), tarOf(t, symlink("s", "b")))
	if got, _ := os.Readlink(filepath.Join(root, "s")); got != "b" {
		t.Fatalf("s -> %s", got)
	}
}
