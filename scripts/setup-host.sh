#!/bin/sh
# Install the host tools Kiln drives (Debian 12) and the deb-src entry the Debian-source
# mirror needs. Idempotent: installs only what is missing.
set -eu
PACKAGES="python3-venv bubblewrap debootstrap util-linux tar xz-utils zstd cpio squashfs-tools kmod qemu-system-x86 qemu-utils ovmf golang-go
  grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools dosfstools e2fsprogs fdisk gdisk ipxe-qemu gzip
  lvm2 mdadm ntfs-3g exfatprogs f2fs-tools lzip dnsmasq-base chrony iproute2 socat"
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
