#!/bin/sh
# Install the host tools Kiln drives (Debian 12) and the deb-src entry the Debian-source
# mirror needs. Idempotent: installs only what is missing.
#
# `setup-host.sh --image` installs only what building packages and making the metal and iso
# images needs (IMAGE_PACKAGES: the sandbox, debootstrap, the archivers, GRUB, xorriso, mtools,
# the strip of each arch, qemu-user for arm64's cross-built test steps), for a CI job that builds
# and uploads images (docs/ci.md); without it, everything the tests need too (QEMU system
# emulators and firmware, swtpm, the signing tools, the installer's file systems, Go, Azurite, ...).
#
# skopeo and cosign check Kiln's signed installer images as a user would (tests/integration/
# test_release_push_cosign.py). Debian 12's skopeo has sigstore verification compiled out by a
# Debian patch and Debian 12 has no cosign, so the full setup also unpacks Debian 13's skopeo and
# cosign, with the C library and the few libraries they link, into VERIFIERS_HOME, run through that
# C library's own loader; nothing of the system's is replaced, and Debian 13 never enters the
# system's apt sources.
set -eu
IMAGE_PACKAGES="python3-venv git bubblewrap debootstrap util-linux tar xz-utils zstd lzip gzip cpio
  squashfs-tools kmod grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools dosfstools fdisk
  binutils binutils-aarch64-linux-gnu qemu-user-static"
PACKAGES="python3-venv graphviz fonts-dejavu-core fish diffoscope-minimal bubblewrap debootstrap util-linux tar xz-utils zstd cpio squashfs-tools kmod qemu-system-x86 qemu-utils ovmf golang-go
  gcc libc6-dev
  grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools dosfstools e2fsprogs fdisk gdisk ipxe-qemu gzip
  lvm2 mdadm ntfs-3g exfatprogs f2fs-tools lzip dnsmasq-base chrony iproute2 socat
  qemu-system-arm qemu-efi-aarch64 qemu-user-static binutils-aarch64-linux-gnu
  osslsigncode sbsigntool efitools systemd-boot-efi shim-unsigned swtpm swtpm-tools binutils
  libtss2-esys-3.0.2-0 libtss2-tcti-swtpm0 libtss2-rc0 chromium skopeo"
VERIFIERS_HOME=/usr/local/lib/kiln/debian13
VERIFIERS_DEBS="skopeo cosign libc6 libgpgme11t64 libassuan9 libgpg-error0 libsqlite3-0"
# Azurite, Microsoft's Azure Storage emulator (npm), which `kiln release upload azure`'s tests start
# themselves. 3.35.0 is the newest release that runs on Node 20 (3.36 asks for Node 21 or later).
AZURITE_VERSION=3.35.0
TEST_TOOLS=1
case "${1:-}" in
    --image) PACKAGES=$IMAGE_PACKAGES; TEST_TOOLS="" ;;
    "") ;;
    *) echo "usage: $0 [--image]" >&2; exit 2 ;;
esac
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

SRC_LIST=/etc/apt/sources.list.d/kiln-src.list
need_update=""
if ! grep -rqs '^deb-src .*debian.* bookworm main' /etc/apt/sources.list /etc/apt/sources.list.d/ \
   && ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/; then
    echo "setup-host: adding $SRC_LIST (Debian source packages, for the Debian-source mirror)"
    echo 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main' \
        | $SUDO tee "$SRC_LIST" >/dev/null
    need_update=1
fi

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ] || [ -n "$need_update" ]; then
    $SUDO apt-get update -qq
fi
if [ -n "$missing" ]; then
    echo "setup-host: installing$missing"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# Azurite from npm, unless this version is installed already. npm comes with NodeSource's nodejs;
# Debian's own nodejs (18) needs its npm package beside it.
if [ -n "$TEST_TOOLS" ] && [ "$(azurite --version 2>/dev/null || true)" != "$AZURITE_VERSION" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "setup-host: installing nodejs npm (for Azurite)"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
    fi
    echo "setup-host: installing azurite@$AZURITE_VERSION (npm)"
    $SUDO npm install --global --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION"
fi

# Cross builds run their packages' test steps through qemu-user: register its binfmt handler
# for the other architecture (with the F flag, so build sandboxes can use it) when systemd
# has not (containers and CI machines often run without systemd-binfmt).
BINFMT=/proc/sys/fs/binfmt_misc
case "$(uname -m)" in x86_64) other=aarch64 ;; aarch64) other=x86_64 ;; *) other="" ;; esac
if [ -n "$other" ] && [ -f "/usr/lib/binfmt.d/qemu-$other.conf" ] && [ ! -e "$BINFMT/qemu-$other" ]; then
    [ -e "$BINFMT/register" ] || $SUDO mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null || true
    if [ -e "$BINFMT/qemu-$other" ]; then
        # binfmt_misc is the kernel's, not the container's: in a privileged CI container, mounting it
        # shows what the host registered already (registering again fails with EEXIST).
        echo "setup-host: qemu-$other is registered for binfmt_misc already"
    elif [ -e "$BINFMT/register" ]; then
        echo "setup-host: registering qemu-$other for binfmt_misc"
        $SUDO sh -c "cat /usr/lib/binfmt.d/qemu-$other.conf > $BINFMT/register"
    else
        echo "setup-host: binfmt_misc is not available: cross builds will skip their test steps" >&2
    fi
fi

# Debian 13's skopeo and cosign in VERIFIERS_HOME (see the top): their .debs from Debian 13's archive
# through apt, with lists and downloads in VERIFIERS_HOME/apt (removed after), unpacked into
# VERIFIERS_HOME/root, each run by a wrapper VERIFIERS_HOME/<name>.
install_debian13_verifiers() {
    case "$(dpkg --print-architecture)" in
        amd64) triplet=x86_64-linux-gnu; loader=ld-linux-x86-64.so.2 ;;
        arm64) triplet=aarch64-linux-gnu; loader=ld-linux-aarch64.so.1 ;;
        *) echo "setup-host: no Debian 13 skopeo and cosign for $(dpkg --print-architecture)" >&2; return 0 ;;
    esac
    if [ -x "$VERIFIERS_HOME/skopeo" ] && "$VERIFIERS_HOME/skopeo" --version >/dev/null 2>&1 \
       && [ -x "$VERIFIERS_HOME/cosign" ] && "$VERIFIERS_HOME/cosign" version >/dev/null 2>&1; then
        return 0
    fi
    echo "setup-host: unpacking Debian 13's skopeo (sigstore verification on) and cosign into $VERIFIERS_HOME"
    apt_dir=$VERIFIERS_HOME/apt
    $SUDO rm -rf "$VERIFIERS_HOME"
    $SUDO mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs" "$VERIFIERS_HOME/root"
    echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' \
        | $SUDO tee "$apt_dir/sources.list" >/dev/null
    set -- -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root
    $SUDO apt-get "$@" update -qq
    (cd "$apt_dir/debs" && $SUDO apt-get "$@" download $VERIFIERS_DEBS)
    for deb in "$apt_dir"/debs/*.deb; do
        $SUDO dpkg-deb -x "$deb" "$VERIFIERS_HOME/root"
    done
    $SUDO rm -rf "$apt_dir"
    lib=$VERIFIERS_HOME/root/usr/lib/$triplet
    for tool in skopeo cosign; do
        printf '#!/bin/sh\n# %s from Debian 13, run through its own C library (scripts/setup-host.sh)\nexec %s --library-path %s %s "$@"\n' \
            "$tool" "$lib/$loader" "$lib" "$VERIFIERS_HOME/root/usr/bin/$tool" | $SUDO tee "$VERIFIERS_HOME/$tool" >/dev/null
        $SUDO chmod 755 "$VERIFIERS_HOME/$tool"
    done
    "$VERIFIERS_HOME/skopeo" --version
    "$VERIFIERS_HOME/cosign" version 2>&1 | grep -i '^GitVersion' || true
}
if [ -n "$TEST_TOOLS" ]; then
    install_debian13_verifiers
fi
