"""Pictures of what Kiln builds, for people who would rather look than read.

`graph` draws the package graph through Graphviz (`kiln graph --format svg|png`), `timeline` a
build's Gantt chart from `kiln build --json` (`kiln report timeline`), `sizes` what takes the space
in an image (`kiln report sizes`); `plot` is the one place matplotlib is set up, `command` the
`report` verb's arguments.

Why matplotlib rather than hand-written SVG: the charts need axes with sensible ticks, text that
is measured rather than guessed (a long package name must not run into its bar), legends and
PNG as well as SVG, and a hand-rolled SVG writer grows exactly those features, untested by anyone
else. matplotlib is heavy (numpy, pillow, fonttools) but pinned like every dependency, imported
only when a chart is drawn (so `kiln`'s start-up does not pay for it), and its SVG output is made
reproducible here: a fixed hash salt for element ids, no date in the metadata.
"""
