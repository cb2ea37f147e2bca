"""Installing and (next) upgrading: `kiln install` onto a disk; the installer image itself is an image output."""
