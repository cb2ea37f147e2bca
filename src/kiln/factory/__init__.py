"""The image factory: schematics in, images out, over HTTP (kiln factory serve)."""
