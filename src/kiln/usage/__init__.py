"""What the command line tells about itself: the environment variables `kiln --help` lists
(`environment`) and `kiln completion`'s scripts (`completion`; fish's made by `fish`, the others by
shtab). Both are made from what the code holds, so they cannot drift from it."""
