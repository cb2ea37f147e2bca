"""The store: content-addressed package outputs, safe under concurrent kiln processes.

`store` holds the Store, `pins` a run's holds on entries, `manifest` what an entry records of its tree, `locks` the
generic lock-file protocol and `files` the durable writes; docs/store.md has the layout and the
guarantees.
"""

from kiln.build.store.manifest import MANIFEST, FileRecord, read_manifest
from kiln.build.store.pins import Pins
from kiln.build.store.store import META, Entry, Store, check_key

__all__ = ["MANIFEST", "META", "Entry", "FileRecord", "Pins", "Store", "check_key", "read_manifest"]
