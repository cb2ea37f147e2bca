"""`kiln node`: talking to running machines over machined's mutual-TLS API (status, logs, rollback,
rolling upgrades). It builds nothing, so it imports only `core`."""
