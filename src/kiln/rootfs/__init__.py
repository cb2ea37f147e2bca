"""The booting system's images: rootfs squashfs, initramfs, system extensions."""
