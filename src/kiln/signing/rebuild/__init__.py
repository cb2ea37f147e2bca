"""`kiln verify --rebuild RELEASE_DIR`: build a release again from what its provenance records, and compare.

- recorded: each output directory's provenance, read as someone else's input, as a build to replay;
- checkout: the recorded commit in a scratch worktree of the project's repository, and the command
  that runs that checkout's own `kiln image`;
- compare: the rebuilt artifacts against the release's SHA256SUMS and files, with diffoscope reports;
- run: the phases (checkout, one build per directory, compare), timed, and what they found.
"""
