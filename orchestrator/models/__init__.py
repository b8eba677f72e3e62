"""Models by name: `hf:ORG/NAME[@REV]` located (location.py), fetched from the hub once at
this machine (hub.py, pull.py) and listed with what they are (catalog.py)."""
