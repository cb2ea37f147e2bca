"""The QEMU harness behind `kiln boot` and the end-to-end tests."""
