"""Sources: fetched once, verified by sha256, kept by hash; mirrors before the upstream URL.

One job per module: `mirrors` (kiln-project.yaml's and KILN_MIRRORS' list of places to look),
`download` (the fetcher: mirrors, then the URL; parallel fetches), `cache` (what
`$KILN_CACHE/sources/` holds and how a cached file stays trusted), `archives` (the safety
check of every archive a build unpacks) and `place` (sources put into a build root).
"""
