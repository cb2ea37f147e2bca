"""The build room's verbs: one module each, with `add_arguments(parser)` and `run(ctx)` (kiln.core.verb).

They sit above everything else in `build/` (an import-linter contract keeps them there) and import
the build machinery only when they run, so parsing a command line never pays for it.
"""
