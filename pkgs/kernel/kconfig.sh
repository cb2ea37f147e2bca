#!/bin/sh
# The kernel's configuration, shared by the kernel package's build and `kiln kernel`:
#
#   kconfig.sh SRC OBJ KARCH BASE FRAGMENT_DIR FRAGMENTS
#
# merges BASE (pkgs/kernel/config-<arch>, savedefconfig form) and the comma-separated
# FRAGMENTS (FRAGMENT_DIR/<name>.config, later ones win) with the kernel's own
# scripts/kconfig/merge_config.sh into OBJ/.config, runs `make olddefconfig`, and then checks
# that every option a fragment asked for survived with the value asked for: Kconfig silently
# drops an option whose dependencies are not met, and a build must not silently lack it.
# Options of BASE are checked the same way; KCONFIG_BASE_CHECK=warn only reports those
# (`kiln kernel` uses it, so a refreshed config can be written back without them).
set -eu

if [ $# -ne 6 ]; then
    echo "usage: kconfig.sh SRC OBJ KARCH BASE FRAGMENT_DIR FRAGMENTS" >&2
    exit 2
fi
src=$1 obj=$2 karch=$3 base=$4 fragdir=$5 fragments=$6

available() {
    ls "$fragdir" 2>/dev/null | sed -n 's/\.config$//p' | tr '\n' ' '
}

files=""
for name in $(echo "$fragments" | tr ',' ' '); do
    case $name in
        *[!A-Za-z0-9._-]* | .*) echo "kconfig: '$name' is not a fragment name" >&2; exit 2 ;;
    esac
    if [ ! -f "$fragdir/$name.config" ]; then
        echo "kconfig: no fragment '$name' (pkgs/kernel/fragments/$name.config); available: $(available)" >&2
        exit 2
    fi
    files="$files $fragdir/$name.config"
done

mkdir -p "$obj"
cd "$src"
echo "kconfig: $base${files:+ +$files}"
# -m: merge only; olddefconfig below resolves the result. Warnings about overridden values are expected.
# shellcheck disable=SC2086
scripts/kconfig/merge_config.sh -m -O "$obj" "$base" $files >"$obj/merge.log" 2>&1 || {
    cat "$obj/merge.log" >&2
    exit 1
}
make -s O="$obj" ARCH="$karch" olddefconfig

# Every requested option must have its requested value ("is not set" == absent).
# shellcheck disable=SC2086
awk -v base="$base" -v mode="${KCONFIG_BASE_CHECK:-error}" '
    function record(line, into,    name, value) {
        if (line ~ /^CONFIG_[A-Za-z0-9_]+=/) {
            name = line; sub(/=.*/, "", name)
            value = line; sub(/^[^=]*=/, "", value)
        } else if (line ~ /^# CONFIG_[A-Za-z0-9_]+ is not set$/) {
            name = line; sub(/^# /, "", name); sub(/ is not set$/, "", name)
            value = "n"
        } else {
            return ""
        }
        into[name] = value
        return name
    }
    FNR == 1 { file++ }
    file == 1 { record($0, final); next }
    { name = record($0, wanted); if (name != "") from[name] = FILENAME }
    END {
        bad = 0
        for (name in wanted) {
            got = (name in final) ? final[name] : "n"
            if (got == wanted[name]) continue
            show_w = wanted[name] == "n" ? "is not set" : "=" wanted[name]
            show_g = got == "n" ? "is not set" : "=" got
            msg = sprintf("%s: %s asked for %s, the final .config has %s", from[name], name, show_w, show_g)
            if (from[name] == base && mode == "warn") {
                print "kconfig: warning: " msg > "/dev/stderr"
            } else {
                print "kconfig: " msg > "/dev/stderr"
                bad++
            }
        }
        if (bad) {
            printf "kconfig: %d requested option(s) did not survive olddefconfig (unmet dependencies or unknown options)\n", bad > "/dev/stderr"
            exit 1
        }
    }
' "$obj/.config" "$base" $files
echo "kconfig: $obj/.config ok ($(grep -c '=y$' "$obj/.config") built in, $(grep -c '=m$' "$obj/.config") modules)"
