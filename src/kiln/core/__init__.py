"""What every room uses: errors with locations, the console, host paths and containment, files, hashing, sizes."""
