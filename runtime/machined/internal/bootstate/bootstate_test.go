package bootstate

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// image is the block Kiln's imager writes (kiln.image.outputs.grub.environment_block).
func image(lines ...string) []byte {
	text := header + strings.Join(lines, "")
	return []byte(text + strings.Repeat("#", Size-len(text)))
}

func TestParseTheImagersBlock(t *testing.T) {
	st, err := Parse(image("kiln_default=A\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Default != "A" || st.Next != "" || st.Tries != 0 || st.Rollback != "" {
		t.Fatalf("got %+v", st)
	}
}

func TestParseWhatGrubLeavesAfterGivingUp(t *testing.T) {
	// GRUB's save_env keeps the other variables and sets the listed ones, empty included.
	st, err := Parse(image("kiln_default=A\n", "kiln_next=\n", "kiln_tries=\n", "kiln_rollback=B\n", "kiln_version_B=2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Default != "A" || st.Next != "" || st.Rollback != "B" || st.Versions["B"] != "2" {
		t.Fatalf("got %+v", st)
	}
	if st.Booted("A") != "default" {
		t.Fatalf("booted A after a rollback: %s", st.Booted("A"))
	}
}

func TestParseRefusesWhatIsNoBlock(t *testing.T) {
	for name, block := range map[string][]byte{
		"short":     []byte(header + "kiln_default=A\n"),
		"no header": append([]byte("kiln_default=B\n"), bytes.Repeat([]byte("#"), Size-15)...),
		"no equals": image("kiln_default\n"),
	} {
		if _, err := Parse(block); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestParseIgnoresSlotsThatAreNotSlots(t *testing.T) {
	st, err := Parse(image("kiln_default=../etc\n", "kiln_next=C\n", "kiln_tries=99\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Default != "A" || st.Next != "" || st.Tries != 0 {
		t.Fatalf("got %+v", st)
	}
}

func TestEncodeRoundTripsAndKeepsOthersVariables(t *testing.T) {
	st := State{Default: "B", Next: "A", Tries: 3, Versions: map[string]string{"A": "2", "B": "1"}, Extra: map[string]string{"saved_entry": "0"}}
	block, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(block) != Size || !bytes.HasPrefix(block, []byte(header+"kiln_default=B\nkiln_next=A\nkiln_tries=3\nkiln_version_A=2\nkiln_version_B=1\nsaved_entry=0\n#")) {
		t.Fatalf("block:\n%s", block)
	}
	back, err := Parse(block)
	if err != nil {
		t.Fatal(err)
	}
	if back.Default != "B" || back.Next != "A" || back.Tries != 3 || back.Extra["saved_entry"] != "0" {
		t.Fatalf("round trip: %+v", back)
	}
}

func TestEncodeRefusesWhatDoesNotFit(t *testing.T) {
	st := State{Default: "A", Extra: map[string]string{"x": strings.Repeat("v", Size)}}
	if _, err := st.Encode(); err == nil {
		t.Fatal("encoded an oversized block")
	}
	st = State{Default: "A", Versions: map[string]string{"A": "1\nkiln_default=B"}}
	if _, err := st.Encode(); err == nil {
		t.Fatal("encoded a backslash")
	}
}

func TestTrialThenGoodOrGivenUp(t *testing.T) {
	st := State{Default: "A"}
	if err := st.Try("B", "2", 3); err != nil {
		t.Fatal(err)
	}
	if st.Booted("B") != "trial" || st.Booted("A") != "default" {
		t.Fatalf("booted: %s %s", st.Booted("B"), st.Booted("A"))
	}
	if st.MarkGood("A") {
		t.Fatal("the default slot was marked good as if it were on trial")
	}
	if !st.MarkGood("B") || st.Default != "B" || st.Next != "" || st.Tries != 0 {
		t.Fatalf("after MarkGood: %+v", st)
	}
	if st.MarkGood("B") {
		t.Fatal("marked good twice")
	}
	if err := st.Try("A", "3", 0); err == nil {
		t.Fatal("zero tries accepted")
	}
	if err := st.Try("C", "3", 1); err == nil {
		t.Fatal("slot C accepted")
	}
}

func TestWriteReplacesTheBlockWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grubenv")
	if err := os.WriteFile(path, image("kiln_default=A\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Try("B", "2", 2); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, st); err != nil {
		t.Fatal(err)
	}
	back, err := Read(path)
	if err != nil || back.Next != "B" || back.Tries != 2 || back.Versions["B"] != "2" {
		t.Fatalf("read back %+v, %v", back, err)
	}
	if _, err := os.Stat(path + ".new"); !os.IsNotExist(err) {
		t.Fatalf("the temporary block is left: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries", len(entries))
	}
}

func FuzzParse(f *testing.F) {
	f.Add(image("kiln_default=A\n"))
	f.Add(image("kiln_default=B\n", "kiln_next=A\n", "kiln_tries=1\n"))
	f.Fuzz(func(t *testing.T, block []byte) {
		st, err := Parse(block)
		if err != nil {
			return
		}
		if !Valid(st.Default) || (st.Next != "" && !Valid(st.Next)) || st.Tries < 0 || st.Tries > MaxTries {
			t.Fatalf("parsed an invalid state %+v", st)
		}
		if out, err := st.Encode(); err == nil {
			if _, err := Parse(out); err != nil {
				t.Fatalf("its own encoding does not parse: %v", err)
			}
		}
	})
}

// BOOT is a drive like any other: its grubenv is read only as a regular file, and only so far.
func TestReadRefusesLinksAndHugeFiles(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "grubenv")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(link); err == nil {
		t.Fatal("a grubenv link to /dev/zero was read")
	}
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, make([]byte, 64*Size+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(huge); err == nil {
		t.Fatal("an oversized grubenv was read")
	}
}

func TestGiveUpEndsOnlyTheTrialOfThatSlot(t *testing.T) {
	st := State{Default: "A", Next: "B", Tries: 2, Versions: map[string]string{"A": "1", "B": "2"}}
	if st.GiveUp("A") || st.Next != "B" {
		t.Fatalf("gave up a slot that is not on trial: %+v", st)
	}
	if !st.GiveUp("B") || st.Default != "A" || st.Next != "" || st.Tries != 0 || st.Rollback != "B" {
		t.Fatalf("after GiveUp: %+v", st)
	}
	if st.Versions["B"] != "2" {
		t.Fatalf("versions lost: %+v", st.Versions)
	}
}
