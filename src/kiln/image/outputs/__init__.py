"""One module per output kind, made from boot assets.

iso, pxe, disk (the raw GPT image), formats (qcow2, vhd, vmdk, ova) and installer (the OCI image);
grub is the menu the GRUB-booted ones share.
"""
