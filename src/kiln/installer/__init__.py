"""The imager: profiles, and the ISO, disk, PXE, cloud and installer outputs made from boot assets."""
