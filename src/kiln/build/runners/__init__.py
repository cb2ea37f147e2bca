"""Where steps run: the embedded bubblewrap sandbox (default), Docker, BuildKit."""
