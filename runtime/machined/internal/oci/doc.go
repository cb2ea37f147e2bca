// Package oci pulls Kiln installer images: from an OCI distribution registry or from the OCI
// image layout tarball `kiln image` writes, and unpacks their layers into a directory.
//
// machined runs it as PID 1 to upgrade the machine, so everything it fetches is treated as
// hostile: every document is size-bounded and parsed strictly, every blob is checked against
// the sha256 digest and size of the descriptor that named it while it streams, and Unpack never
// follows a symlink or writes outside its root. Only sha256 digests are accepted: it is what
// every registry and Kiln use, and it keeps a digest a safe path and URL element.
//
// It is standard library only, like the rest of machined: no vendored registry client.
package oci
