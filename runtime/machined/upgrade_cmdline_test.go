package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"kiln/machined/internal/bootstate"
)

// grubWords reads a line as GRUB's script lexer does for what grubCmdline may write: words
// split by spaces, single quotes taken literally. It fails on any character outside quotes that
// GRUB gives a meaning (a command's end, an expansion, a comment, a block, another quote).
func grubWords(t testing.TB, line string) []string {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			if c == '\n' {
				t.Fatalf("%q: a newline in quotes", line)
			}
			cur.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.IndexByte(";&|{}$#\"\\<>\n\t`()*?[]!", c) >= 0:
			t.Fatalf("%q: unquoted %q", line, c)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("%q: an open quote", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

var hostileCmdlines = []string{
	"console=ttyS0 panic=1",
	"quiet; linux /B/vmlinuz evil",
	"a && reboot",
	"x | y",
	"$root ${prefix} $(id)",
	"} menuentry x { linux /x",
	"kiln.config=http://10.0.2.2/k.json#sha256=00 # comment",
	`dyndbg="file x.c +p" "a;b"`,
	"<in >out `cmd`",
	"a  b   c",
	"",
}

func TestTheCmdlineCannotBreakOutOfGRUBsLinuxLine(t *testing.T) {
	for _, c := range hostileCmdlines {
		args, err := grubCmdline(c)
		if err != nil {
			t.Fatalf("%q: %v", c, err)
		}
		if got, want := strings.Join(grubWords(t, args), " "), strings.Join(strings.Fields(c), " "); got != want {
			t.Errorf("%q: GRUB passes %q, want %q", c, got, want)
		}
	}
	for _, c := range []string{"a'b", `a\b`, "a\nlinux /x", "x\x00", "a\tb", "é", "x kiln.slot=B", "'kiln.slot=B'", strings.Repeat("a", 2049)} {
		if _, err := grubCmdline(c); err == nil {
			t.Errorf("%q: accepted", c)
		}
	}
}

// A release whose command line holds GRUB script is written quoted into boot.cfg, which keeps
// exactly one linux line and one initrd line.
func TestBootCfgOfAHostileCmdlineHasOnlyItsTwoLines(t *testing.T) {
	dir := newRelease(t, `{"architecture": "`+runtime.GOARCH+`", "cmdline": "panic=1; linux /A/vmlinuz $x", "version": "0.2.0"}`)
	boot := newBoot(t, bootstate.State{Default: "A"})
	if err := writeSlotInto(dir, boot, "B", 3, func(string, ...interface{}) {}); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(boot, "B", "boot.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	want := "linux /B/vmlinuz 'panic=1;' linux /A/vmlinuz '$x' kiln.slot=B\ninitrd /B/initramfs.zst\n"
	if string(cfg) != want {
		t.Fatalf("boot.cfg:\n%s\nwant:\n%s", cfg, want)
	}
}

// FuzzGrubCmdline: any command line is refused or written so that GRUB reads back exactly its
// words, with nothing outside quotes that GRUB's script would act on.
func FuzzGrubCmdline(f *testing.F) {
	for _, c := range hostileCmdlines {
		f.Add(c)
	}
	f.Add("a'b")
	f.Fuzz(func(t *testing.T, c string) {
		args, err := grubCmdline(c)
		if err != nil {
			return
		}
		if strings.Contains(c, "kiln.slot=") || strings.ContainsAny(c, "\n\r'\\") {
			t.Fatalf("%q accepted", c)
		}
		if got, want := strings.Join(grubWords(t, args), " "), strings.Join(strings.Fields(c), " "); got != want {
			t.Fatalf("%q: GRUB passes %q, want %q", c, got, want)
		}
	})
}
