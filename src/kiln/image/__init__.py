"""The imager and the whole `kiln image` verb: profiles, then the outputs made from boot assets.

ISO, disk images and their formats, PXE, cloud images and the installer image, each with a
manifest and an SPDX SBOM.
"""
