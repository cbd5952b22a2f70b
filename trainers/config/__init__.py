"""What a run is set up from: the shared run config, the presets, and the registry of algorithms."""
