"""One writer module per output kind, made from boot assets, and the registry of kinds (kinds).

iso, pxe, image (the raw GPT disk of disk, in a format of formats: qcow2, vhd, vmdk, ova),
installer (the OCI image), uki (which also assembles the UKIs the others boot), kernel and
initramfs; grub is the menu the GRUB-booted ones share, secureboot their signed chain.
"""
