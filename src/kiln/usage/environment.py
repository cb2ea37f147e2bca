"""The environment variables Kiln reads: one list, for `kiln --help` and docs/cli.md (a test keeps
both and the code in step)."""

from __future__ import annotations

VARIABLES: dict[str, str] = {
    "KILN_VERSION": "the release's version, when --release-version and --set kiln_version are not given",
    "KILN_CACHE": "where the store and every cache live (default ~/.cache/kiln)",
    "KILN_MIRRORS": "source mirrors, in place of kiln-project.yaml's mirrors: (empty: upstream URLs only)",
    "KILN_PROGRESS": "auto, plain or tty: how builds show progress, when --progress is not given",
    "KILN_STATE_DIR": "where the key that signs the compiled-template cache is kept (default $XDG_STATE_HOME/kiln)",
    "KILN_INSECURE_REGISTRIES": "registries reached over plain HTTP besides loopback ones (comma-separated)",
    "KILN_DOCKER": "the docker CLI the buildkit runner uses (default: docker on PATH)",
    "KILN_STAGE0_IMAGE": "the seed as an image in a registry, for a remote BuildKit builder (buildkit runner, "
    "docs/distributed.md)",
    "BUILDX_BUILDER": "the buildx builder the buildkit runner builds on (default: docker's current one)",
    "KILN_NODECONFIG": "kiln node's config file (default ~/.config/kiln/nodeconfig.yaml)",
    "KILN_RELEASE_KEY": "the public key kiln verify trusts when --key is not given (release.pub, release-image.pub)",
    "DOCKER_HOST": "the Docker engine of the docker runner (default the local socket)",
    "DOCKER_CONFIG": "where registry credentials are read (config.json, as docker stores them)",
    "XDG_CACHE_HOME": "the base of the default KILN_CACHE",
    "XDG_STATE_HOME": "the base of the default KILN_STATE_DIR",
}


def help_text() -> str:
    """The epilog of `kiln --help`."""
    width = max(len(name) for name in VARIABLES)
    lines = ["environment:"] + [f"  {name.ljust(width)}  {what}" for name, what in VARIABLES.items()]
    return "\n".join(lines)
