#!/bin/sh
# The kernel's object tree, kept between builds (the step's `cache:`), so that an edit recompiles
# what kbuild's own dependency tracking says it touches (a config option, a patched file) and not
# the whole kernel:
#
#   incremental.sh begin SRC OBJ   before kconfig.sh, after the source is unpacked and patched
#   incremental.sh end SRC OBJ     after a successful make
#
# kbuild decides what to rebuild from mtimes, and the source is unpacked afresh for every build,
# so mtimes say nothing about content. `begin` therefore sets every source file to one old time
# (SOURCE_DATE_EPOCH) and then gives the current time to each file whose sha256 differs from the
# list `end` saved after the last good build (or that is new): exactly those are newer than the
# objects made from them. A file a patch no longer adds is absent, which kbuild's .cmd files
# treat as a changed dependency.
#
# The tree is emptied when another toolchain or arch made it (its stamp: the compilers' digests
# from ccache's compiler_check, binutils', make's and perl's, ARCH and CROSS_COMPILE) or it has no
# list from a good build. What a build that never reached `end` (a failure, a kill) wrote is
# deleted by the next `begin`: every file newer than its marker, but Kconfig's outputs. None of
# this is trusted for releases: `kiln build --check` starts with empty caches and compares the
# bytes (docs/reproducibility.md).
set -eu

if [ $# -ne 3 ]; then
    echo "usage: incremental.sh begin|end SRC OBJ" >&2
    exit 2
fi
mode=$1 src=$2 obj=$3
stamp=$obj/.kiln-stamp
sums=$obj/.kiln-sources
marker=$obj/.kiln-building

# every source file's sha256, sorted by line, as comm wants them
digests() {
    (cd "$src" && find . -type f -print0 | xargs -0 -r sha256sum) | sort
}

identity() {
    sed -n 's/^compiler_check = //p' "$CCACHE_CONFIGPATH"
    echo "ARCH=${ARCH:-} CROSS_COMPILE=${CROSS_COMPILE:-}"
    for tool in make perl ld objcopy nm "${CROSS_COMPILE:-}ld" "${CROSS_COMPILE:-}objcopy" "${CROSS_COMPILE:-}nm"; do
        if path=$(command -v "$tool"); then sha256sum "$path"; else echo "no $tool"; fi
    done
}

case $mode in
begin)
    mkdir -p "$obj"
    want=$(identity)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$sums" ]; then
        if [ -f "$marker" ]; then
            # The last build did not reach `end`: what it wrote may be half-written (make deletes
            # a failed target, but not after a kill). Kconfig's outputs are written whole and say
            # which options changed; they stay.
            find "$obj" -newer "$marker" ! -type d ! -path "$obj/.config" ! -path "$obj/include/config/*" \
                ! -path "$obj/include/generated/autoconf.h" -delete
        fi
        kept=yes
    else
        find "$obj" -mindepth 1 -delete
        printf '%s\n' "$want" > "$stamp"
        : > "$sums"
        kept=no
    fi
    touch "$marker"
    digests > /tmp/kiln-sources
    find "$src" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    if [ "$kept" = yes ]; then
        # sha256sum's lines are 64 hex digits, two characters, then the path
        comm -13 "$sums" /tmp/kiln-sources | cut -c67- > /tmp/kiln-changed
        (cd "$src" && xargs -r -d '\n' touch -h -- < /tmp/kiln-changed)
        echo "incremental: object tree kept; $(wc -l < /tmp/kiln-changed) source files changed since its last good build"
    else
        echo "incremental: object tree empty (a first build, or another toolchain or arch)"
    fi
    ;;
end)
    mv /tmp/kiln-sources "$sums"
    rm -f "$marker"
    ;;
*)
    echo "incremental.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
