"""Project scripts: the host setup, the CI services, the rooms picture and the test lanes."""
