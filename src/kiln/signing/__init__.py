"""Keys and signatures: a user's Secure Boot and release keys (`kiln keys generate`), Authenticode
signing of EFI binaries, and signed release checksums (`kiln verify`).

Keys belong to the user: Kiln reads them from a key directory the profile or the command line
names, and never copies a private key into an output or the store.
"""
